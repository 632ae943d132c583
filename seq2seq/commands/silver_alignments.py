"""Silver word alignments: `seq2seq silver-alignments [--split train] [--out FILE]` (or
`python scripts/silver_alignments.py`); the procedure is seq2seq.alignment.silver.silver_alignments.

`--split test` (the default) aligns the test set together with the training set and writes only the
test set's lines: the silver standard AER is scored against. `--split train` aligns the training set
alone and writes all of its lines: the file that `train.py --guided-alignment` reads (one line per
training pair; a blank pair gets an empty line), made without the test set's text. `--symmetrize`
picks how eflomal's two directions become one set of links; `--with-possible` also writes the links
of either direction left out, as possible links (`ipj`). The file is written whole or not at all.
Needs `pip install -e .[align]`.
"""

import argparse
import sys
from pathlib import Path

from seq2seq.alignment.silver import silver_alignments
from seq2seq.atomic import atomic_write_text, check_writable_file
from seq2seq.cli import Parser
from seq2seq.data.corpus import SHARED_DATA
from seq2seq.decoding.flags import refuse_unread
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
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    if args.split == "train":  # the training set alone: no test text shapes what training reads
        files, extra = (args.train_src, args.train_tgt), None
    else:
        files, extra = (args.src_file, args.tgt_file), (args.train_src, args.train_tgt)
    out = Path(args.out or default_out(*files))
    try:
        if args.split == "train":
            why = "is the test set's: --split train aligns --train-src and --train-tgt alone"
            refuse_unread(parser, args, ["src_file", "tgt_file"], why)
        inputs = (*files, *(extra or ()))  # before eflomal's minutes, not after them
        check_writable_file(out, f"--out {out}", inputs)
        links = silver_alignments(*files, extra, args.symmetrize, args.with_possible)
        write_out(out, links.text())
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(
        f"{out}: {len(links.lines)} lines, {links.links_per_sentence:.2f} links per sentence, "
        f"{links.extra_pairs} extra pairs, eflomal {links.seconds:.1f} s",
        file=sys.stderr,
    )
    return 0


def default_out(src_path: str, tgt_path: str) -> str:
    """data/silver/<split>.<src>-<tgt>.align, from the names of the files (<split>.<lang>[.gz])."""
    split, _, src = Path(src_path).name.removesuffix(".gz").rpartition(".")
    tgt = Path(tgt_path).name.removesuffix(".gz").rpartition(".")[2]
    return f"data/silver/{split or src}.{src}-{tgt}.align"


def write_out(out: Path, text: str) -> None:
    """Publish the links file whole (fsynced, renamed into place) or leave what was there."""
    try:
        atomic_write_text(out, text)
    except OSError as err:
        raise UserError(f"--out {out}: cannot write ({err.strerror})") from None
