"""`seq2seq average CKPT CKPT ... --out FILE` (or `python scripts/average_checkpoints.py ...`): the
mean of the weights of checkpoints of one run (seq2seq.decoding.averaging), a checkpoint for decoding."""

import argparse
import sys

from seq2seq.cli import Parser
from seq2seq.decoding.averaging import average_checkpoints
from seq2seq.errors import UserError


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    parser = Parser(prog=prog, description="Average the weights of checkpoints of one run.")
    parser.add_argument("checkpoints", nargs="+", metavar="CKPT", help="two or more .ckpt files")
    parser.add_argument("--out", required=True, metavar="FILE", help="the averaged checkpoint")
    return parser


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    args = build_parser(prog).parse_args(argv)
    notes: list[str] = []
    try:
        out = average_checkpoints(args.checkpoints, args.out, notes)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"averaged {len(args.checkpoints)} checkpoints into {out}")
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    return 0
