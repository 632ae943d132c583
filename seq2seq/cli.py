"""What every command line shares: the parser (no abbreviations, errors in one line), flags made from a
dataclass's fields, and the spelling of a setting as a flag in messages.

The library names a setting as `name` in its errors; `cli_message` turns that into --name. A script's
parser is a `Parser`: `--scor additive` is refused instead of read as --score, and a refusal is one
line, `<script>: error: <reason> (see --help)`, with exit status 2 like every UserError.
"""

import argparse
import dataclasses
import re
import sys
import types
import typing
from typing import Any, Literal, NoReturn


class Parser(argparse.ArgumentParser):
    """argparse without prefix matching, whose errors are one line naming --help."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message} (see --help)\n")
        sys.exit(2)


def as_flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def base_type(annotation: Any) -> Any:
    """int | None -> int; Literal[...] stays as it is."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return next(a for a in typing.get_args(annotation) if a is not type(None))
    return annotation


class DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends "(default: X)" unless the help already says what the default is."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.help and "default:" in action.help:
            return action.help
        return super()._get_help_string(action)


def add_flags(parser: argparse.ArgumentParser, schema: type) -> None:
    """One flag per field of the dataclass `schema`; choices from Literal types; help from metadata."""
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        kind = base_type(hints[f.name])
        kwargs: dict[str, Any] = {"default": f.default, "help": f.metadata["help"]}
        if f.name == "resume":
            kwargs.update(nargs="?", const="latest", metavar="PATH")
        elif kind is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif typing.get_origin(kind) is Literal:
            kwargs["choices"] = typing.get_args(kind)
        else:
            kwargs["type"] = kind
        parser.add_argument(as_flag(f.name), dest=f.name, **kwargs)


def cli_message(err: Exception) -> str:
    """The library names a setting as `name` in its messages; on the command line it is --name."""
    return re.sub(r"`([a-z][a-z0-9_]*)`", lambda found: as_flag(found.group(1)), str(err))
