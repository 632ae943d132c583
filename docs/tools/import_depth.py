"""The package's import graph at a glance: modules per folder and the longest chain of imports.

    python docs/tools/import_depth.py [CHECKOUT]     # default: this checkout

Every `import` and `from ... import` of a seq2seq module counts, at module level or inside a function;
the package's own `__init__` (the lazy `Translator` and `load_model`) is left out, as it imports on
demand. Depth: the modules on the longest chain, the first importing the second, and so on.
"""

import ast
import functools
import sys
from collections import Counter, defaultdict
from pathlib import Path

from seq2seq.cli import Parser


def graph(root: Path) -> tuple[dict[str, Path], dict[str, set[str]]]:
    """The modules of `root`'s seq2seq package by dotted name, and what each imports of them."""
    modules = {
        ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__"): path
        for path in (root / "seq2seq").rglob("*.py")
    }
    edges: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module:
                targets = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            edges[name] |= {t for t in targets if t in modules and t not in (name, "seq2seq")}
    return modules, edges


def main(argv: list[str] | None = None) -> int:
    parser = Parser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "checkout", nargs="?", default=str(Path(__file__).resolve().parents[2]),
        help="a checkout of this repository (default: this one)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    root = Path(args.checkout)
    modules, edges = graph(root)
    if not modules:
        parser.error(f"{args.checkout}: no seq2seq package there (seq2seq/*.py)")

    @functools.cache
    def depth(module: str) -> int:
        return 1 + max(map(depth, edges[module]), default=0)

    folders = Counter(p.parent.relative_to(root).as_posix() for p in modules.values()
                      if p.stem != "__init__")  # fmt: skip
    print(f"{sum(folders.values())} modules; the longest import chain: {max(map(depth, modules))}")
    for folder, count in sorted(folders.items()):
        print(f"  {folder}/: {count}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
