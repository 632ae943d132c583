"""Draw the benchmark scripts' JSON as PNGs: speed per path, memory over a run, memory against size.

    python scripts/plot_benchmarks.py [--speed benchmark.json] [--memory memory.json]
        [--scale scale-1000000.json scale-10000000.json ...] --out-dir docs/figures

- `--speed` (scripts/benchmark.py --json): target tokens/s of each training path, a bar each, with
  the CPU (model, capability, native bf16) in the title; a path the run skipped is a labelled gap.
  Writes `speed.png`.
- `--memory` (scripts/benchmark_memory.py --json): the resident set of each train.py run (fp32,
  bf16-mixed) at every reading, over updates, and each run's peak (VmHWM) as a dashed line.
  Writes `memory.png`.
- `--scale` (scripts/benchmark_scale.py --json, one file per corpus size): the preparation's peak
  (largest process's RSS, and the process tree's PSS) against training pairs, log scale; with the
  training runs' peaks where the files have them. Writes `scale.png`.

Figures are matplotlib's object API on an Agg canvas, as in seq2seq.alignment.plotting: no pyplot, no display.
"""

import json
import sys
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from seq2seq.cli import Parser
from seq2seq.errors import UserError

DPI = 100


def read_json(path: str, needs: tuple[str, ...], script: str) -> dict:
    """A benchmark's JSON, or a UserError naming the file when it is not `script`'s."""
    try:
        result = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise UserError(f"{path}: cannot read it as JSON ({type(err).__name__})") from None
    if not isinstance(result, dict) or any(key not in result for key in needs):
        raise UserError(f"{path}: not the JSON of {script} (no {', '.join(needs)})")
    return result


def speed_figure(result: dict) -> Figure:
    """Target tokens/s per path (benchmark.py), skipped paths as labelled gaps."""
    names = [*result["paths"], *result.get("skipped", {})]
    fig = Figure(figsize=(1.6 + 1.2 * len(names), 3.6), dpi=DPI)
    ax = fig.add_subplot()
    speeds = [result["paths"][k]["tokens_per_sec"] for k in result["paths"]]
    bars = ax.bar(range(len(speeds)), speeds, color="tab:blue")
    ax.bar_label(bars, labels=[f"{v:,.0f}" for v in speeds], fontsize=8)
    for i in range(len(speeds), len(names)):  # the skipped paths
        ax.text(i, 0, "skipped", ha="center", va="bottom", fontsize=8, rotation=90)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("target tokens/s (training)")
    cpu = result.get("cpu")
    where = result["device"] if result["device"] != "cpu" or cpu is None else cpu["model"]
    if cpu is not None:
        where += f", {cpu['capability']}, {'native' if cpu['native_bf16'] else 'no native'} bf16"
    ax.set_title(f"{where}; {result['threads']} threads", fontsize=9)
    ax.margins(y=0.15)
    fig.tight_layout()
    return fig


def memory_figure(result: dict) -> Figure:
    """Resident memory over updates per train.py run (benchmark_memory.py), and each run's peak."""
    fig = Figure(figsize=(6.4, 3.6), dpi=DPI)
    ax = fig.add_subplot()
    for i, (precision, run) in enumerate(result["train"].items()):
        color = f"C{i}"
        updates, mb = [r["update"] for r in run["rss"]], [r["mb"] for r in run["rss"]]
        ax.plot(updates, mb, marker=".", color=color, label=f"{precision}: RSS")
        ax.axhline(run["peak_rss_mb"], ls="--", lw=1, color=color, label=f"{precision}: peak")
    ax.set_xlabel("update")
    ax.set_ylabel("resident memory, MB")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title(f"train.py, {result['updates']:,} updates", fontsize=9)
    fig.tight_layout()
    return fig


def scale_figure(results: list[dict]) -> Figure:
    """Preparation peak (and training peak, where measured) against corpus size, one point a file."""
    results = sorted(results, key=lambda r: r["pairs"])
    pairs = [r["pairs"] for r in results]
    fig = Figure(figsize=(6.4, 3.6), dpi=DPI)
    ax = fig.add_subplot()
    for key, label in (("max_rss_mb", "largest process, RSS"), ("tree_pss_mb", "all, PSS")):
        ax.plot(pairs, [r["prepare"][key] for r in results], marker="o", label=f"prepare: {label}")
    trained = [r for r in results if r["train"].get(f"synthetic-{r['pairs']}")]
    if trained:
        peaks = [r["train"][f"synthetic-{r['pairs']}"]["max_rss_mb"] for r in trained]
        ax.plot([r["pairs"] for r in trained], peaks, marker="s", label="train.py: peak RSS")
    ax.set_xscale("log")
    ax.set_xlabel("training pairs")
    ax.set_ylabel("peak memory, MB")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig


def save(fig: Figure, path: Path) -> Path:
    FigureCanvasAgg(fig)  # an Agg canvas: no GUI backend involved
    fig.savefig(path, dpi=DPI)
    return path


def main(argv: list[str] | None = None) -> int:
    p = Parser(description=__doc__.split("\n")[0])
    p.add_argument("--speed", metavar="JSON", help="scripts/benchmark.py --json output")
    p.add_argument("--memory", metavar="JSON", help="scripts/benchmark_memory.py --json output")
    p.add_argument("--scale", metavar="JSON", nargs="+", help="scripts/benchmark_scale.py --json")
    p.add_argument("--out-dir", default=".", help="where the PNGs go (default: here)")
    args = p.parse_args(argv)
    try:
        if not (args.speed or args.memory or args.scale):
            raise UserError("nothing to draw: give --speed, --memory or --scale")
        figures = []
        if args.speed:
            speed = read_json(args.speed, ("paths", "device", "threads"), "benchmark.py")
            figures.append(("speed.png", speed_figure(speed)))
        if args.memory:
            memory = read_json(args.memory, ("train", "updates"), "benchmark_memory.py")
            figures.append(("memory.png", memory_figure(memory)))
        if args.scale:
            needs, script = ("pairs", "prepare", "train"), "benchmark_scale.py"
            figures.append(
                ("scale.png", scale_figure([read_json(f, needs, script) for f in args.scale]))
            )
        out = Path(args.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        for name, fig in figures:
            print(save(fig, out / name))
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
