"""Paired A/B of a training update: the given functions as at a commit (A) against the working tree (B).

    python docs/tools/paired_ab.py N REV path/to/module.py:Class.attr [...] [path/to/dep.py ...]
        [--path NAME] [-- train.py flags]

Builds the data and the model as `scripts/benchmark.py` does (its `fast` path unless `--path` names
another of its paths, e.g. `bf16`: forward, backward, clipping, Adam) and runs each of the first N
training batches twice back to back, once with each attribute as it is at REV (its module's source
at REV, executed apart) and once as in the working tree, in alternating order. A path without an attribute names a module whose source at REV the
old attributes import in place of today's (when the two change together). Prints the ratio of the
summed times and the median of the per-batch ratios (A / B: above 1, B is faster). A batch's two
runs a second apart see the same machine, so the pairs resolve differences that whole windows on a
noisy shared machine do not.
"""

import argparse
import importlib
import statistics
import subprocess
import sys
import time
import types

import torch

from seq2seq.benchmarks.speed import make_paths
from seq2seq.cli import Parser, count
from seq2seq.training.config import parse_args


def source_at(rev: str, path: str) -> str:
    """A file's text at rev."""
    return subprocess.run(["git", "show", f"{rev}:{path}"], capture_output=True, text=True,
                          check=True).stdout  # fmt: skip


def module_at(rev: str, path: str) -> types.ModuleType:
    """`path/to/module.py` as it was at rev, executed apart, with the modules in sys.modules."""
    name = path.removesuffix(".py").replace("/", ".")
    old = types.ModuleType(name)
    exec(compile(source_at(rev, path), f"{rev}:{path}", "exec"), old.__dict__)  # noqa: S102
    return old


def old_attribute(rev: str, spec: str) -> tuple[object, str, object, object]:
    """(owner, name, value at rev, value now) for `path/to/module.py:Class.attr`."""
    path, dotted = spec.split(":")
    module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
    old = module_at(rev, path)
    *parents, attr = dotted.split(".")
    owner, old_owner = module, old
    for part in parents:
        owner, old_owner = getattr(owner, part), getattr(old_owner, part)
    get = lambda o: o.__dict__[attr] if isinstance(o, type) else getattr(o, attr)  # noqa: E731
    return owner, attr, get(old_owner), get(owner)


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """This tool's flags, and train.py's after `--`."""
    ours, flags = (
        (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    )
    parser = Parser(description=__doc__.split("\n")[0], epilog="After --: train.py's flags.")
    parser.add_argument("count", type=count, metavar="N", help="training batches, each run A and B")
    parser.add_argument("rev", metavar="REV", help="the commit whose code is A")
    parser.add_argument(
        "specs", nargs="+", metavar="SPEC",
        help="path/to/module.py:Class.attr, an attribute taken at REV; path/to/dep.py, a module "
        "whose source at REV the old attributes import",
    )  # fmt: skip
    parser.add_argument("--path", default="fast", help="scripts/benchmark.py's path that is timed")
    args = parser.parse_args(ours)
    try:
        subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{args.rev}^{{commit}}"],
                       capture_output=True, check=True)  # fmt: skip
    except subprocess.CalledProcessError:
        parser.error(f"REV {args.rev}: not a commit of this repository")
    return args, flags


def main(argv: list[str] | None = None) -> int:
    args, flags = parse(sys.argv[1:] if argv is None else argv)
    path_name, batches, rev, specs = args.path, args.count, args.rev, args.specs
    deps = {s.removesuffix(".py").replace("/", "."): s for s in specs if ":" not in s}
    for spec in specs:  # today's modules first, importing today's
        importlib.import_module(spec.split(":")[0].removesuffix(".py").replace("/", "."))
    now = {name: sys.modules[name] for name in deps}
    sys.modules.update({name: module_at(rev, path) for name, path in deps.items()})
    swaps = [old_attribute(rev, spec) for spec in specs if ":" in spec]
    sys.modules.update(now)  # the old attributes hold the old modules' names; the rest, today's
    _, _, paths = make_paths(parse_args(flags), [path_name], torch.device("cpu"))
    fast = paths[path_name]

    def use(side: str) -> None:
        for owner, attr, old, new in swaps:
            setattr(owner, attr, old if side == "A" else new)

    for side in "AB":  # warm-up: allocator, Adam's state
        use(side)
        for batch, _, _ in fast.all[-3:]:
            fast.step(batch)
    times: dict[str, list[float]] = {"A": [], "B": []}
    for i in range(batches):
        batch = fast.all[i][0]
        for side in "AB" if i % 2 == 0 else "BA":
            use(side)
            start = time.perf_counter()
            fast.step(batch)
            times[side].append(time.perf_counter() - start)
    ratios = [a / b for a, b in zip(times["A"], times["B"], strict=True)]
    low, _, high = statistics.quantiles(ratios, n=4)
    total_a, total_b = sum(times["A"]), sum(times["B"])
    print(f"{batches} batches: A {total_a:.2f} s, B {total_b:.2f} s, A/B of the sums "
          f"{total_a / total_b:.3f}; per batch: median {statistics.median(ratios):.3f}, quartiles "
          f"{low:.3f}-{high:.3f} (A = {rev}, B = the working tree; above 1: B faster)")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
