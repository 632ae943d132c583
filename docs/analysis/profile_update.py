"""Where a training update's time goes, per op and per input shape: torch.profiler over the fast path.

    python docs/analysis/profile_update.py [--updates N] [--rows N] [train.py flags]

Builds the data and the model as `scripts/benchmark.py` does (its `fast` path: the loss training runs,
forward, backward, clipping and Adam), warms up, then profiles `--updates` updates on the CPU. Prints
the time in matmuls (mm, addmm, bmm) against the rest, and the heaviest ops by self CPU time, one row
per op and input shape. What it showed, and what came of it: docs/benchmarks.md.
"""

import sys
from pathlib import Path as FilePath

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(FilePath(__file__).resolve().parents[2] / "scripts"))
from benchmark import make_paths  # noqa: E402

from seq2seq.cli import Parser  # noqa: E402
from seq2seq.machine import cpu_line  # noqa: E402
from seq2seq.training.config import parse_args  # noqa: E402

MATMULS = ("aten::mm", "aten::addmm", "aten::bmm")


def main(argv: list[str] | None = None) -> int:
    p = Parser(description=__doc__.split("\n")[0], epilog="Others: train.py's.")
    p.add_argument("--updates", type=int, default=4, help="updates profiled, after 4 of warm-up")
    p.add_argument("--rows", type=int, default=30, help="ops shown")
    args, rest = p.parse_known_args(argv)
    cfg = parse_args(rest)
    _, _, paths = make_paths(cfg, ["fast"], torch.device("cpu"))
    fast = paths["fast"]
    fast.window(4)  # allocator, Adam's state
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        fast.window(args.updates)
    events = [e for e in prof.key_averages(group_by_input_shape=True) if e.key.startswith("aten::")]
    by_op = [e for e in prof.key_averages() if e.key.startswith("aten::")]
    # Self times of aten ops add up to the update's time (wrappers such as autograd nodes left out).
    total = sum(e.self_cpu_time_total for e in events)
    matmul = sum(e.self_cpu_time_total for e in events if e.key in MATMULS)
    print(f"{cpu_line()}; {torch.get_num_threads()} threads; {args.updates} updates")
    print(
        f"aten self time {total / 1e3 / args.updates:,.1f} ms an update, matmuls {matmul / total:.0%}"
    )
    for title, rows in (("per op", by_op), ("per op and input shapes", events)):
        print(f"\n{title + ':':32s} {'% of time':>9s} {'ms/update':>9s} {'calls':>6s}")
        for e in sorted(rows, key=lambda e: -e.self_cpu_time_total)[: args.rows]:
            share, ms = e.self_cpu_time_total / total, e.self_cpu_time_total / 1e3 / args.updates
            shapes = str(e.input_shapes)[:70] if rows is events else ""
            calls = e.count / args.updates
            print(f"{e.key:32s} {share:9.1%} {ms:9.2f} {calls:6.1f}  {shapes}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
