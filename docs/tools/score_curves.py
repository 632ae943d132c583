"""How each run's attention statistics move over training, from its TensorBoard events.

Prints, per run, `val/score_std` (the standard deviation of the scores the softmax reads, over a
row's real source positions), `val/max_weight` and `val/attn_entropy` at chosen validations, as a
Markdown table; with `--png`, draws the first two over updates, one line per run, a colour per
variant (the run's name before `-seed`). By default train.py validates once an epoch, so validation k
is the end of epoch k. The curves in docs/results/study.md were printed and drawn by

    python docs/tools/score_curves.py /root/study-work/runs/{additive,dot,scaled}-seed2 \
        --at 1 2 5 10 20 --png docs/figures/score-curves.png
"""

import sys
from pathlib import Path

from seq2seq.cli import Parser
from seq2seq.study.events import run_curves

TAGS = (("val/score_std", "score sd"), ("val/max_weight", "max weight"))
TABLE_TAGS = (*TAGS, ("val/attn_entropy", "entropy"))


def table(runs: dict[str, dict[str, list[tuple[int, float]]]], at: list[int]) -> str:
    """One row per run and statistic; a column per validation in `at` (1-based)."""
    lines = [
        "| run | statistic | " + " | ".join(f"validation {k}" for k in at) + " |",
        "|---|---|" + "---|" * len(at),
    ]
    for name, tags in runs.items():
        for tag, title in TABLE_TAGS:
            points = tags.get(tag, [])
            cells = [f"{points[k - 1][1]:.3f}" if k <= len(points) else "-" for k in at]
            lines.append(f"| {name} | {title} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(runs: dict[str, dict[str, list[tuple[int, float]]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from seq2seq.atomic import atomic_write

    variants = list(dict.fromkeys(name.split("-seed")[0] for name in runs))
    fig, axes = plt.subplots(1, len(TAGS), figsize=(4.6 * len(TAGS), 3.4), squeeze=False)
    for ax, (tag, title) in zip(axes[0], TAGS, strict=True):
        for name, tags in runs.items():
            points = tags.get(tag, [])
            colour = f"C{variants.index(name.split('-seed')[0])}"
            ax.plot([s for s, _ in points], [v for _, v in points], color=colour, label=name)
        ax.set_title(f"{title} ({tag}, validation)")
        ax.set_xlabel("update")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    atomic_write(path, lambda file: fig.savefig(file, format="png", dpi=110))
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "runs", nargs="+", type=Path, help="train.py run folders (holding version_0/)"
    )
    parser.add_argument(
        "--at", nargs="+", type=int, default=[1, 2, 5, 10, 20], metavar="K",
        help="validations to print, 1-based (default: 1 2 5 10 20)",
    )  # fmt: skip
    parser.add_argument("--png", type=Path, help="also draw the curves into this PNG")
    args = parser.parse_args(argv)
    if any(k < 1 for k in args.at):
        parser.error("--at counts validations from 1")
    runs = {run.name: run_curves(run) for run in args.runs}
    missing = [name for name, tags in runs.items() if TAGS[0][0] not in tags]
    if missing:  # not a train.py folder, or trained before the statistic was logged
        print(f"error: {', '.join(missing)}: no {TAGS[0][0]} in version_*/ events", file=sys.stderr)
        return 2
    print(table(runs, args.at))
    if args.png:
        plot(runs, args.png)
        print(f"wrote {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
