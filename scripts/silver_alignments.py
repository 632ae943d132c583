"""Silver-standard word alignments of a test set: `python scripts/silver_alignments.py [--out FILE]`.

Multi30k has no hand-made word alignments, so the reference our attention is scored against is the
output of eflomal (Östling & Tiedemann 2016), a statistical aligner. Its estimates improve with more
text, so the test set is aligned together with the training set and only the test set's lines are
written. eflomal aligns both directions; the two are intersected (eflomal ships no symmetrisation of
its own; its README defers to fast_align's atools), which keeps the links both directions agree on.
`--with-possible` also writes the links only one direction found, as possible links (`ipj`).

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

from seq2seq.alignment import Link, format_pharaoh
from seq2seq.corpus import SHARED_DATA, read_lines
from seq2seq.errors import UserError

MULTI30K = SHARED_DATA / "multi30k"
FILES = {  # flag: (default, help)
    "--src-file": (MULTI30K / "test_2016_flickr.de.gz", "test set source side (plain or .gz)"),
    "--tgt-file": (MULTI30K / "test_2016_flickr.en.gz", "test set target side, line-aligned"),
    "--train-src": (MULTI30K / "train.de.gz", "extra source text aligned alongside, not written"),
    "--train-tgt": (MULTI30K / "train.en.gz", "extra target text, line-aligned with --train-src"),
    "--out": ("data/silver/test_2016_flickr.de-en.align", "Pharaoh file, one line per test pair"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Silver word alignments: align the test set together with extra parallel "
        "text using eflomal (statistical, randomly seeded; pip install -e .[align]), intersect "
        "its two directions, and write the test set's links in Pharaoh format (i-j = source "
        "word i, target word j; words are the raw sentence's whitespace tokens, from 0).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    for flag, (default, text) in FILES.items():
        parser.add_argument(flag, default=str(default), help=text)
    parser.add_argument(
        "--with-possible",
        action="store_true",
        help="also write links found in one direction only, as possible (ipj)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return silver_alignments(args)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


def silver_alignments(args: argparse.Namespace) -> int:
    try:
        import eflomal
    except ImportError:
        raise UserError("eflomal is not installed: pip install -e .[align]") from None
    src, tgt = read_pair(args.src_file, args.tgt_file)
    train_src, train_tgt = read_pair(args.train_src, args.train_tgt)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="eflomal-") as tmp:
        fwd, rev = Path(tmp) / "fwd", Path(tmp) / "rev"
        try:  # eflomal reads tokens with str.split(): the raw sentence's whitespace words
            eflomal.Aligner().align(
                train_src + src,
                train_tgt + tgt,
                links_filename_fwd=str(fwd),
                links_filename_rev=str(rev),
                quiet=True,
            )
        except SystemExit:  # eflomal exits when its binary is missing
            raise UserError("eflomal could not run its binary: pip install -e .[align]") from None
        n = len(train_src) + len(src)
        fwd_links, rev_links = read_links(fwd, n), read_links(rev, n)
    lines = []
    for i in range(len(train_src), n):
        sure = fwd_links[i] & rev_links[i]  # both directions agree
        line = format_pharaoh(sure)
        if args.with_possible:
            maybe = sorted((fwd_links[i] | rev_links[i]) - sure)
            line = " ".join([line] * bool(line) + [f"{s}p{t}" for s, t in maybe])
        lines.append(line)
    check_bounds(lines, src, tgt, args.src_file)
    write_atomically(Path(args.out), lines)
    links = sum(len(line.split()) for line in lines)
    print(
        f"{args.out}: {len(lines)} lines, {links / max(len(lines), 1):.2f} links per sentence, "
        f"{len(train_src)} extra pairs, eflomal {time.perf_counter() - start:.1f} s",
        file=sys.stderr,
    )
    return 0


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


if __name__ == "__main__":
    sys.exit(main())
