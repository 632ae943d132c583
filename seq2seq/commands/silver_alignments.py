"""Silver word alignments: `seq2seq silver-alignments [--split train] [--out FILE]` (or
`python scripts/silver_alignments.py`).

Multi30k has no hand-made word alignments, so the reference our attention is scored against is the
output of eflomal (Östling & Tiedemann 2016), a statistical aligner. Its estimates improve with more
text, so the test set is aligned together with the training set and only the test set's lines are
written. `--split train` aligns the training set alone and writes all of its lines: the file that
`train.py --guided-alignment` reads (one line per training pair; a blank pair gets an empty line),
made without the test set's text. eflomal aligns both directions; `--symmetrize` makes one set of
them (seq2seq.alignment.words.symmetrize: `intersect`, the links both agree on, or `grow-diag-final-and`,
denser; eflomal ships no symmetrisation of its own, its README defers to fast_align's atools).
`--with-possible` also writes the links of either direction left out, as possible links (`ipj`).

Words are the whitespace-separated tokens of the raw sentences, numbered from 0: the same words the
model's alignments use. eflomal lowercases tokens for its statistics, which leaves indices alone.
eflomal seeds itself from /dev/urandom, so two runs differ slightly. Needs `pip install -e .[align]`.
"""

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from seq2seq.alignment.words import format_pharaoh, symmetrize
from seq2seq.cli import Parser
from seq2seq.data.corpus import SHARED_DATA, read_lines
from seq2seq.data.words import Link
from seq2seq.errors import UserError

MULTI30K = SHARED_DATA / "multi30k"
FILES = {  # flag: (default, help)
    "--src-file": (MULTI30K / "test_2016_flickr.de.gz", "test set source side (plain or .gz)"),
    "--tgt-file": (MULTI30K / "test_2016_flickr.en.gz", "test set target side, line-aligned"),
    "--train-src": (MULTI30K / "train.de.gz", "training set source side: aligned alongside the "
                    "test set (not written), or with --split train aligned alone and written"),
    "--train-tgt": (MULTI30K / "train.en.gz", "training set target side, line-aligned"),
    "--out": (None, "Pharaoh file, one line per pair of the split; None: data/silver/"
              "<split file>.<src>-<tgt>.align, e.g. test_2016_flickr.de-en.align"),
}  # fmt: skip


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    parser = Parser(
        prog=prog,
        description="Silver word alignments: align the test set together with the training set "
        "(or, with --split train, the training set alone) using eflomal (statistical, randomly "
        "seeded; pip install -e .[align]), symmetrize its two directions, and write the split's "
        "links in Pharaoh format (i-j = source word i, target word j; words are the raw "
        "sentence's whitespace tokens, from 0).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    for flag, (default, text) in FILES.items():
        parser.add_argument(flag, default=default and str(default), help=text)
    parser.add_argument(
        "--split",
        choices=("test", "train"),
        default="test",
        help="the lines to write: the test set (aligned with the training set) or the training "
        "set (aligned alone; for train.py --guided-alignment)",
    )
    parser.add_argument(
        "--symmetrize",
        choices=("intersect", "grow-diag-final-and"),
        default="intersect",
        help="how eflomal's two directions become one set of links",
    )
    parser.add_argument(
        "--with-possible",
        action="store_true",
        help="also write the links of either direction left out, as possible (ipj)",
    )
    return parser  # fmt: skip


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    args = build_parser(prog).parse_args(argv)
    try:
        return silver_alignments(args)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


def silver_alignments(args: argparse.Namespace) -> int:
    if args.split == "train":  # the training set alone: no test text shapes what training reads
        (src_path, tgt_path), extra = (args.train_src, args.train_tgt), ([], [])
    else:
        (src_path, tgt_path) = (args.src_file, args.tgt_file)
        extra = read_pair(args.train_src, args.train_tgt)
    src, tgt = read_pair(src_path, tgt_path)
    start = time.perf_counter()
    # Blank pairs (either side) are not aligned; they keep their line, empty.
    real = [i for i, (s, t) in enumerate(zip(src, tgt, strict=True)) if s.split() and t.split()]
    fwd, rev = align_both_ways(extra[0] + [src[i] for i in real], extra[1] + [tgt[i] for i in real])
    lines = [""] * len(src)
    for i, k in zip(real, range(len(extra[0]), len(fwd)), strict=True):
        chosen = symmetrize(fwd[k], rev[k], args.symmetrize)
        line = format_pharaoh(chosen)
        if args.with_possible:
            maybe = sorted((fwd[k] | rev[k]) - set(chosen))
            line = " ".join([line] * bool(line) + [f"{s}p{t}" for s, t in maybe])
        lines[i] = line
    check_bounds(lines, src, tgt, src_path)
    out = args.out or default_out(src_path, tgt_path)
    write_atomically(Path(out), lines)
    links = sum(len(line.split()) for line in lines)
    print(
        f"{out}: {len(lines)} lines, {links / max(len(lines), 1):.2f} links per sentence, "
        f"{len(extra[0])} extra pairs, eflomal {time.perf_counter() - start:.1f} s",
        file=sys.stderr,
    )
    return 0


def align_both_ways(src: list[str], tgt: list[str]) -> tuple[list[set[Link]], list[set[Link]]]:
    """eflomal's forward and reverse links per pair, both written (source word, target word)."""
    try:
        import eflomal
    except ImportError:
        raise UserError("eflomal is not installed: pip install -e .[align]") from None
    with tempfile.TemporaryDirectory(prefix="eflomal-") as tmp:
        fwd, rev = Path(tmp) / "fwd", Path(tmp) / "rev"
        try:  # eflomal reads tokens with str.split(): the raw sentence's whitespace words
            eflomal.Aligner().align(
                src, tgt, links_filename_fwd=str(fwd), links_filename_rev=str(rev), quiet=True
            )
        except SystemExit:  # eflomal exits when its binary is missing
            raise UserError("eflomal could not run its binary: pip install -e .[align]") from None
        return read_links(fwd, len(src)), read_links(rev, len(src))


def default_out(src_path: str, tgt_path: str) -> str:
    """data/silver/<split>.<src>-<tgt>.align, from the names of the files (<split>.<lang>[.gz])."""
    split, _, src = Path(src_path).name.removesuffix(".gz").rpartition(".")
    tgt = Path(tgt_path).name.removesuffix(".gz").rpartition(".")[2]
    return f"data/silver/{split or src}.{src}-{tgt}.align"


def read_pair(src_path: str, tgt_path: str) -> tuple[list[str], list[str]]:
    """Line-aligned sentences of two files; a count mismatch names both files."""
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    if len(src) != len(tgt):
        raise UserError(f"{src_path} has {len(src)} lines but {tgt_path} has {len(tgt)}")
    return src, tgt


def read_links(path: Path, n: int) -> list[set[Link]]:
    """eflomal's links file, both directions written source-target; n lines expected."""
    if not path.exists():
        raise UserError(f"eflomal wrote no {path.name} links (see its messages above)")
    lines = read_lines(path)
    if len(lines) != n:
        raise UserError(f"eflomal wrote {len(lines)} {path.name} lines for {n} sentence pairs")
    return [{tuple(map(int, pair.split("-"))) for pair in line.split()} for line in lines]


def check_bounds(lines: list[str], src: list[str], tgt: list[str], src_path: str) -> None:
    """Every link must point at a word that exists; eflomal and we must agree on the words."""
    for number, (line, s, t) in enumerate(zip(lines, src, tgt, strict=True), start=1):
        for token in line.split():
            i, j = map(int, token.replace("p", "-").split("-"))
            if i >= len(s.split()) or j >= len(t.split()):
                raise UserError(f"{src_path} line {number}: link {token} is outside the sentence")


def write_atomically(path: Path, lines: list[str]) -> None:
    """Write beside `path`, then rename: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in lines))
        os.chmod(tmp, 0o644)  # mkstemp makes it private
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
