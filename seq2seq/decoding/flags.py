"""The flags evaluate.py and translate.py share: search (one flag per SearchConfig field), batching
and the device; the same helpers as the training flags (seq2seq.training.config)."""

import argparse
import dataclasses
from collections.abc import Sequence

import torch

from seq2seq.alignment.words import READINGS
from seq2seq.cli import DefaultsFormatter, Parser, add_flags, as_flag, cli_message
from seq2seq.decoding.search import SearchConfig
from seq2seq.errors import UserError


def decoding_parser(description: str, prog: str | None = None) -> argparse.ArgumentParser:
    """The flags evaluate.py and translate.py share: search (SearchConfig), batching and device.
    `prog`: the command's name in usage and errors (default: the script's file name)."""
    parser = Parser(prog=prog, description=description, formatter_class=DefaultsFormatter)
    add_flags(parser, SearchConfig)
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--batch-tokens", type=int, default=4096, help="source tokens per batch")
    size.add_argument("--batch-size", type=int, help="sentences per batch (instead of tokens)")
    parser.add_argument(
        "--device", default="auto", help="cpu, cuda, cuda:1, ... (auto: cuda if available)"
    )
    return parser


def add_reading_flags(parser: argparse.ArgumentParser, reverse_help: str) -> None:
    """`--align-reading` and `--reverse`, which evaluate and translate share; `reverse_help` says
    what the command does with the other direction's checkpoint."""
    parser.add_argument(
        "--align-reading", choices=READINGS, default="attention",
        help="read the links from the model's attention, or from its foresight head "
        "(seq2seq fit-foresight)",
    )  # fmt: skip
    parser.add_argument("--reverse", metavar="CKPT2", help=reverse_help)


def refuse_unread(
    parser: argparse.ArgumentParser, args: argparse.Namespace, names: Sequence[str], why: str
) -> None:
    """Refuse the first of `names` (dests) that `args` holds at other than its default: a flag that
    nothing will read, as `why` ("is for alignment scoring: give --align-ref GOLD too") says."""
    for name in names:
        if getattr(args, name) != parser.get_default(name):
            raise UserError(f"{as_flag(name)} {why}")


def search_config(args: argparse.Namespace) -> SearchConfig:
    """The SearchConfig of parsed decoding flags; a bad value is a UserError naming its flag."""
    for name in ("batch_tokens", "batch_size"):
        value = getattr(args, name, None)
        if value is not None and value < 1:
            raise UserError(f"{as_flag(name)} must be positive, got {value}")
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(SearchConfig)}
    try:
        return SearchConfig(**values)
    except UserError as err:  # "`beam` must be ..." -> "--beam must be ..."
        raise UserError(cli_message(err)) from None


def pick_device(name: str) -> torch.device:
    """The device for `--device NAME` (auto: CUDA when there is one); a bad name is a UserError."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UserError(f"--device {name}: not a device (try cpu or cuda)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"--device {name}: no CUDA device here")
    return device
