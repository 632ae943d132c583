"""Preparation and training start-up on a large synthetic corpus: memory, speed, cache size.

    python scripts/benchmark_scale.py --pairs 1000000 [--work DIR] [--steps 100] [--json FILE]
        [train.py flags]

1. Writes `<work>/synthetic-<N>/`: N training pairs, each two random Multi30k training pairs joined
   (seeded, so sentences are longer and varied, not copies), and Multi30k's val and test splits.
2. Runs `python -m seq2seq prepare` on it in a child process (cache `<work>/cache`).
3. Runs `seq2seq train` for `--steps` updates on it, then with the same model and flags on a
   synthetic corpus of Multi30k's size (29,000 pairs: the same sentence lengths) and on Multi30k.
Memory is the peak resident set: of the largest single process (the kernel's, via wait4), and of
the whole process tree (the sum of its processes' PSS, which counts shared pages once, sampled
every 0.2 s); "RSS at its start" is a training run's when its first batch has not yet been drawn
(data and model). "first update" is seconds from the child's start to the end of its first update.
The extra flags (train.py's) go to every child, e.g. --spm-sample, --prepare-workers; they are
checked before anything is written, and those it sets itself (OWN_FLAGS) are refused. `--json`
also writes the figures (scripts/plot_benchmarks.py draws memory against corpus size from several).
"""

import gzip
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

from seq2seq.atomic import atomic_write_text, check_writable_file
from seq2seq.cli import Parser, count
from seq2seq.data.corpus import resolve_corpus
from seq2seq.errors import UserError
from seq2seq.study.process import package_env
from seq2seq.training.config import parse_args

FIRST = "benchmark_scale: first update at "
STARTED = "benchmark_scale: MB resident when training starts "
CACHE_SIZE = r"train\s+([\d,]+) pairs\s+([\d,.]+) MB\s+(\d+) bytes/pair"  # prepare.py's summary


def write_synthetic(folder: Path, pairs: int, seed: int = 0) -> Path:
    """`folder/train.{de,en}`: `pairs` pairs, each two random Multi30k training pairs joined by a
    space; val and test are Multi30k's own. Written once: an existing complete folder is kept."""
    if (folder / "done").exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    multi30k = _multi30k()
    de, en = (_lines(multi30k / f"train.{lang}.gz") for lang in ("de", "en"))
    rng = np.random.default_rng(seed)
    with open(folder / "train.de", "w") as out_de, open(folder / "train.en", "w") as out_en:
        for start in range(0, pairs, 100_000):
            first, second = rng.integers(0, len(de), (2, min(100_000, pairs - start))).tolist()
            out_de.write("".join(f"{de[i]} {de[j]}\n" for i, j in zip(first, second, strict=True)))
            out_en.write("".join(f"{en[i]} {en[j]}\n" for i, j in zip(first, second, strict=True)))
    for split in ("val", "test_2016_flickr"):
        for lang in ("de", "en"):
            (folder / f"{split}.{lang}").write_text(
                "\n".join(_lines(multi30k / f"{split}.{lang}.gz")) + "\n"
            )
    (folder / "done").touch()
    return folder


def _multi30k() -> Path:
    """The Multi30k folder, found as training finds a corpus (seq2seq.data.corpus)."""
    source = resolve_corpus("multi30k")
    if source.folder is None:
        raise UserError(
            "benchmark_scale needs Multi30k as a folder of .gz files, not the hub's copy"
        )
    return source.folder


def _lines(path: Path) -> list[str]:
    return gzip.decompress(path.read_bytes()).decode().splitlines()


def run_child(args: list[str], log: Path) -> dict:
    """Run `python args...` with stdout and stderr to `log`; wall seconds, exit status, peak RSS of
    its largest process (MB), peak summed PSS of its process tree (MB), and its output."""
    start = time.perf_counter()
    with open(log, "w") as out:
        child = subprocess.Popen(
            [sys.executable, *args], stdout=out, stderr=subprocess.STDOUT, env=package_env()
        )
        peak, done = [0.0], threading.Event()
        watcher = threading.Thread(target=_watch, args=(child.pid, peak, done), daemon=True)
        watcher.start()
        _, status, usage = os.wait4(child.pid, 0)
        done.set()
        watcher.join()
        child.returncode = os.waitstatus_to_exitcode(status)
    text = log.read_text(errors="replace")
    return {
        "seconds": time.perf_counter() - start,
        "status": child.returncode,
        "max_rss_mb": usage.ru_maxrss / 1024,  # kB on Linux
        "cpu_s": usage.ru_utime + usage.ru_stime,  # its waited-for children (workers) included
        "tree_pss_mb": peak[0],
        "output": text,
        "start": start,
    }


def _watch(pid: int, peak: list[float], done: threading.Event) -> None:
    while not done.wait(0.2):
        peak[0] = max(peak[0], sum(_pss_kb(p) for p in _tree(pid)) / 1024)


def _tree(pid: int) -> list[int]:
    pids, todo = [], [pid]
    while todo:
        p = todo.pop()
        pids.append(p)
        for task in Path(f"/proc/{p}/task").glob("*/children"):
            try:
                todo += [int(c) for c in task.read_text().split()]
            except OSError:
                pass
    return pids


def _pss_kb(pid: int) -> int:
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:  # gone already
        return 0
    found = re.search(r"^Pss:\s+(\d+) kB", text, re.M)
    return int(found.group(1)) if found else 0


def train_child(argv: list[str]) -> int:
    """In the child: `seq2seq train`'s main, with a callback that prints the time of the first
    update."""
    import lightning as L

    from seq2seq.commands import train
    from seq2seq.training import run

    class FirstUpdate(L.Callback):
        def on_train_start(self, trainer: L.Trainer, *args: object) -> None:
            rss = Path("/proc/self/status").read_text().split("VmRSS:")[1].split()[0]
            print(f"{STARTED}{int(rss) / 1024:.0f}", flush=True)  # data and model, no batch yet

        def on_train_batch_end(self, trainer: L.Trainer, *args: object) -> None:
            if trainer.global_step == 1:
                print(f"{FIRST}{time.time():.3f}", flush=True)

    build = run.build_trainer
    run.build_trainer = lambda cfg, callbacks, logger: build(  # train() looks it up there
        cfg, [*callbacks, FirstUpdate()], logger
    )
    return train.main(argv)


# The train.py flags each child is given here; the user's extra flags may not set them.
OWN_FLAGS = ("--data-dir", "--dataset", "--cache-dir", "--max-steps", "--log-dir", "--run-name",
             "--accelerator", "--devices")  # fmt: skip


def measure_training(name: str, flags: list[str], work: Path, steps: int) -> dict:
    run_flags = [*flags, "--max-steps", str(steps), "--log-dir", str(work / "runs")]
    run_flags += ["--run-name", name, "--accelerator", "cpu", "--devices", "1"]
    wall_start = time.time()
    result = run_child(
        ["-m", "seq2seq.benchmarks.scale", "--train-child", *run_flags], work / f"train-{name}.log"
    )
    found = re.search(re.escape(FIRST) + r"([\d.]+)", result["output"])
    result["first_update_s"] = float(found.group(1)) - wall_start if found else float("nan")
    found = re.search(re.escape(STARTED) + r"(\d+)", result["output"])
    result["start_rss_mb"] = float(found.group(1)) if found else float("nan")
    return result


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--train-child"]:
        return train_child(argv[1:])
    parser = Parser(description=__doc__.split("\n")[0], epilog="Others: train.py's.")
    parser.add_argument("--pairs", type=count, required=True, help="synthetic training pairs")
    parser.add_argument("--work", default="data/benchmark_scale", help="corpus, cache, runs, logs")
    parser.add_argument(
        "--steps", type=count, default=100,
        help="training updates per run (a run's peak is the heaviest batch it has drawn)",
    )  # fmt: skip
    parser.add_argument("--no-train", action="store_true", help="measure the preparation only")
    parser.add_argument("--json", metavar="FILE", help="also write the figures here")
    args, rest = parser.parse_known_args(argv)
    # train.py's flags are checked now, not after the corpus is written and a child refuses them.
    for word in rest:
        if word.split("=")[0] in OWN_FLAGS:
            parser.error(f"{word.split('=')[0]} is set by this benchmark itself")
    try:
        parse_args(rest)
    except UserError as err:
        parser.error(str(err))
    if args.json:  # refused now, not after the minutes of the runs
        try:
            check_writable_file(args.json, f"--json {args.json}")
        except UserError as err:
            parser.error(str(err))
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    rows = [("pairs", f"{args.pairs:,}"), ("load average at start", _load())]
    figures: dict = {"pairs": args.pairs, "steps": args.steps, "loadavg_start": os.getloadavg()}
    corpus = write_synthetic(work / f"synthetic-{args.pairs}", args.pairs)
    data = ["--data-dir", str(corpus), "--cache-dir", str(work / "cache"), *rest]
    prep = run_child(["-m", "seq2seq", "prepare", *data], work / f"prepare-{args.pairs}.log")
    if prep["status"] != 0:
        print(prep["output"][-3000:], file=sys.stderr)
        return 1
    rows += _prepare_rows(prep)
    figures["prepare"] = {k: prep[k] for k in ("seconds", "cpu_s", "max_rss_mb", "tree_pss_mb")}
    size = re.search(CACHE_SIZE, prep["output"])
    figures["cache_bytes_per_pair"] = int(size[3]) if size else None
    figures["train"] = {}
    if not args.no_train:  # the corpus, one of Multi30k's size and lengths, Multi30k itself
        control = write_synthetic(work / "synthetic-29000", 29_000)
        runs = {
            f"synthetic-{args.pairs}": data,
            "synthetic-29000": ["--data-dir", str(control), "--cache-dir", str(work / "cache")],
            "multi30k": ["--dataset", "multi30k", "--cache-dir", str(work / "cache")],
        }
        peaks = {}
        for name, flags in runs.items():
            ready = run_child(
                ["-m", "seq2seq", "prepare", *flags, *rest], work / f"prepare-{name}.log"
            )
            run = (
                measure_training(name, [*flags, *rest], work, args.steps)
                if ready["status"] == 0
                else ready
            )
            if run["status"] != 0:
                print(run["output"][-3000:], file=sys.stderr)
                return 1
            peaks[name] = run["max_rss_mb"]
            keys = ("first_update_s", "start_rss_mb", "max_rss_mb")
            figures["train"][name] = {k: run[k] for k in keys}
            rows.append((f"training on {name}: first update", f"{run['first_update_s']:.1f} s"))
            rows.append((f"training on {name}: RSS at its start", f"{run['start_rss_mb']:,.0f} MB"))
            rows.append((f"training on {name}: peak RSS", f"{run['max_rss_mb']:,.0f} MB"))
        for other in ("multi30k", "synthetic-29000"):
            ratio = peaks[f"synthetic-{args.pairs}"] / peaks[other]
            rows.append((f"training peak RSS / {other}'s", f"{ratio:.2f}"))
    rows.append(("load average at the end", _load()))
    if args.json:
        figures["loadavg_end"] = os.getloadavg()
        atomic_write_text(args.json, json.dumps(figures, indent=2))  # never a torn file
    width = max(len(k) for k, _ in rows)
    print("\n".join(f"{k:<{width}}  {v}" for k, v in rows))
    return 0


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg()) + f" ({os.cpu_count()} cores)"


def _prepare_rows(prep: dict) -> list[tuple[str, str]]:
    out, rows = prep["output"], [("preparation: wall time", f"{prep['seconds']:.0f} s")]
    spm = re.search(r"training sentencepiece on ([\d,]+) sentences", out)
    ready = re.search(r"tokenizer ready in ([\d.]+) s", out)
    if spm and ready:
        rows.append(
            ("preparation: tokenizer (sample + training)", f"{spm[1]} sentences, {ready[1]} s")
        )
    enc = re.search(
        r"encoded train: ([\d,]+) pairs in ([\d.]+) s \(([\d,]+) pairs/s, (\d+) proc", out
    )
    if enc:
        rows.append(
            (
                "preparation: reading + encoding train",
                f"{enc[3]} pairs/s, {enc[2]} s ({enc[4]} processes)",
            )
        )
    rows += [
        ("preparation: CPU time, all processes", f"{prep['cpu_s']:.0f} s"),
        ("preparation: peak RSS, largest process", f"{prep['max_rss_mb']:,.0f} MB"),
        ("preparation: peak PSS, process tree", f"{prep['tree_pss_mb']:,.0f} MB"),
    ]
    size = re.search(CACHE_SIZE, out)
    if size:
        rows.append(("cache: train split on disk", f"{size[2]} MB, {size[3]} bytes/pair"))
    return rows


if __name__ == "__main__":
    sys.exit(main())
