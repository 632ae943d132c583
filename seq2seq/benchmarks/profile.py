"""Where a training update's time goes, per op and per input shape: torch.profiler over benchmark paths.

    python docs/tools/profile_update.py [--paths fast bf16] [--updates N] [--rows N] [train.py flags]

Builds the data and the model as `scripts/benchmark.py` does (its `fast` path unless `--paths` names
others: the loss training runs, forward, backward, clipping and Adam), warms up, then profiles
`--updates` updates on the CPU. Prints, per path, the time in matmuls (mm, addmm, bmm) against the
rest, and the heaviest ops by self CPU time, one row per op and input shape. With several paths it
ends with a table of each path's matmul time by dtype (their FLOPs from the shapes: 2 m n k) and
the rest, and, where one path has bf16 matmuls, a bound: each path's update if its fp32 matmuls ran
at that measured bf16 rate and nothing else changed, against the first path. What it showed, and
what came of it: docs/results/benchmarks.md.
"""

import sys

import torch
from torch.profiler import ProfilerActivity, profile

from seq2seq.benchmarks.speed import make_paths
from seq2seq.cli import Parser, count
from seq2seq.machine import cpu_line
from seq2seq.training.config import parse_args

MATMULS = ("aten::mm", "aten::addmm", "aten::bmm")
DTYPES = {"c10::BFloat16": "bf16", "float": "fp32"}


def matmul_flops(name: str, shapes: list[list[int]]) -> float:
    """2 m n k, times the batch for bmm, from an event's recorded input shapes."""
    a, b = shapes[1:3] if name == "aten::addmm" else shapes[:2]  # addmm: the added term first
    return 2.0 * (a[0] if len(a) == 3 else 1) * a[-2] * a[-1] * b[-1]


def input_dtypes(prof) -> dict[int, list[str]]:
    """Each event's input dtypes by its id, read from the profiler's kineto events, whose correlation
    id is the event's id: torch 2.11 (the GPU machine's image) has no `FunctionEvent.input_dtypes`,
    2.13 has; the kineto events carry them in both."""
    return {k.correlation_id(): k.dtypes() for k in prof.profiler.kineto_results.events()}


def by_dtype(prof, updates: int) -> dict[str, float]:
    """Seconds an update of matmuls by dtype ('fp32', 'bf16'), their FLOPs ('fp32 flop', ...),
    and of the other aten ops ('other')."""
    out = {"fp32": 0.0, "bf16": 0.0, "fp32 flop": 0.0, "bf16 flop": 0.0, "other": 0.0}
    dtypes = input_dtypes(prof)
    for e in prof.events():
        if not e.name.startswith("aten::"):
            continue
        operand = 1 if e.name == "aten::addmm" else 0  # addmm: the added term first
        kind = DTYPES.get(dtypes[e.id][operand], "other") if e.name in MATMULS else "other"
        out[kind] += e.self_cpu_time_total / 1e6 / updates
        if kind != "other":
            out[f"{kind} flop"] += matmul_flops(e.name, e.input_shapes) / updates
    return out


def main(argv: list[str] | None = None) -> int:
    p = Parser(description=__doc__.split("\n")[0], epilog="Others: train.py's.")
    p.add_argument("--paths", nargs="+", default=["fast"], help="benchmark.py's paths profiled")
    p.add_argument("--updates", type=count, default=4, help="updates profiled, after 4 of warm-up")
    p.add_argument("--rows", type=count, default=30, help="ops shown")
    args, rest = p.parse_known_args(argv)
    cfg = parse_args(rest)
    _, _, paths = make_paths(cfg, args.paths, torch.device("cpu"))
    print(f"{cpu_line()}; {torch.get_num_threads()} threads; {args.updates} updates")
    splits = {name: profile_path(paths[name], name, args) for name in args.paths}
    if len(splits) > 1:
        compare(splits)
    return 0


def profile_path(path, name: str, args) -> dict[str, float]:
    """Profiles `args.updates` updates of `path` after 4, prints its ops; returns `by_dtype`."""
    path.window(4)  # allocator, Adam's state
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        path.window(args.updates)
    events = [e for e in prof.key_averages(group_by_input_shape=True) if e.key.startswith("aten::")]
    by_op = [e for e in prof.key_averages() if e.key.startswith("aten::")]
    # Self times of aten ops add up to the update's time (wrappers such as autograd nodes left out).
    total = sum(e.self_cpu_time_total for e in events)
    matmul = sum(e.self_cpu_time_total for e in events if e.key in MATMULS)
    ms = total / 1e3 / args.updates
    print(f"\n{name}: aten self time {ms:,.1f} ms an update, matmuls {matmul / total:.0%}")
    for title, rows in (("per op", by_op), ("per op and input shapes", events)):
        print(f"\n{title + ':':32s} {'% of time':>9s} {'ms/update':>9s} {'calls':>6s}")
        for e in sorted(rows, key=lambda e: -e.self_cpu_time_total)[: args.rows]:
            share, ms = e.self_cpu_time_total / total, e.self_cpu_time_total / 1e3 / args.updates
            shapes = str(e.input_shapes)[:70] if rows is events else ""
            calls = e.count / args.updates
            print(f"{e.key:32s} {share:9.1%} {ms:9.2f} {calls:6.1f}  {shapes}")
    return by_dtype(prof, args.updates)


def compare(splits: dict[str, dict[str, float]]) -> None:
    """Each path's matmuls by dtype, the rest, and the bound of fp32 matmuls at the bf16 rate."""
    total = {n: s["fp32"] + s["bf16"] + s["other"] for n, s in splits.items()}
    rate = lambda s, k: s[f"{k} flop"] / s[k] / 1e9 if s[k] else 0.0  # noqa: E731 (GFLOP/s)
    print(f"\n{'path':10s} {'ms/update':>9s} {'fp32 mm ms':>10s} {'GFLOP/s':>7s} "
          f"{'bf16 mm ms':>10s} {'GFLOP/s':>7s} {'other ms':>8s}")  # fmt: skip
    for n, s in splits.items():
        print(f"{n:10s} {1e3 * total[n]:9.0f} {1e3 * s['fp32']:10.0f} {rate(s, 'fp32'):7.0f} "
              f"{1e3 * s['bf16']:10.0f} {rate(s, 'bf16'):7.0f} {1e3 * s['other']:8.0f}")  # fmt: skip
    with_bf16 = [s for s in splits.values() if s["bf16"]]
    if not with_bf16:
        return
    bf16_rate = rate(with_bf16[0], "bf16") * 1e9  # FLOP/s
    first = next(iter(splits))
    for n, s in splits.items():
        bound = total[n] - s["fp32"] + s["fp32 flop"] / bf16_rate
        print(f"{n}: every fp32 matmul at {bf16_rate / 1e9:.0f} GFLOP/s: {1e3 * bound:.0f} ms an "
              f"update, {total[first] / bound:.2f}x {first}")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
