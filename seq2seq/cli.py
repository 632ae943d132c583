"""What every command line shares: the parser (no abbreviations, errors in one line), flags made from a
dataclass's fields (each field stated once, with its help and its range: `option`), and the spelling of a
setting as a flag in messages.

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

from seq2seq.errors import UserError


class Parser(argparse.ArgumentParser):
    """argparse without prefix matching, whose errors are one line naming --help."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message} (see --help)\n")
        sys.exit(2)


def count(text: str) -> int:
    """An argparse `type` for a count of things to do (updates, windows, pairs): a whole number >= 1,
    refused at parsing, not after the minutes of work that come before the first use."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: must be at least 1")
    return value


# The ranges `option(..., check=...)` knows; a None value (an optional setting left unset) passes.
CHECKS = {
    "positive": (lambda v: v > 0, "must be positive"),
    "non-negative": (lambda v: v >= 0, "must be zero or more"),
    "fraction": (lambda v: 0.0 <= v < 1.0, "must be in [0, 1)"),
    "seed": (
        lambda v: 0 <= v < 2**32,
        "must be 0 to 4294967295 (numpy's seeds, which Lightning sets)",
    ),
}


def option(
    default: Any,
    help: str,
    check: str | None = None,
    tags: tuple[str, ...] = (),
    per_model: dict[str, Any] | None = None,
) -> Any:
    """A dataclass field that is also a flag: its default, its --help text and, optionally, the
    range its values must lie in (a key of `CHECKS`, checked by `check_fields`), the tags of the
    groups it belongs to (`tagged`), and a default for each model kind (`per_model`, with `default`
    None: the field is filled by `ModelDefaults` from the config's `model` when it is left unset)."""
    if check is not None and check not in CHECKS:
        raise ValueError(f"unknown check {check!r}; choose one of {', '.join(CHECKS)}")
    if per_model is not None:
        if default is not None:
            raise ValueError("a field with per-model defaults has the default None")
        each = ", ".join(f"{value} for {kind}" for kind, value in per_model.items())
        help = f"{help} (default: {each})"
    metadata = {"help": help, "check": check, "tags": tags, "per_model": per_model}
    return dataclasses.field(default=default, metadata=metadata)


def per_model_fields(schema: Any) -> tuple[str, ...]:
    """The names of the fields of `schema` whose default depends on the model kind."""
    return tuple(f.name for f in dataclasses.fields(schema) if f.metadata.get("per_model"))


class ModelDefaults:
    """Base of a settings dataclass: each field declared with `option(None, ..., per_model={...})`
    and left None takes the value for the config's `model`; a part without a `model` field, or a
    model kind not listed (a kind the setting does not apply to, or one `check_fields` refuses
    later), takes the first kind's value."""

    def __post_init__(self) -> None:
        model = getattr(self, "model", None)
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            defaults = f.metadata.get("per_model")
            if defaults and getattr(self, f.name) is None:
                setattr(self, f.name, defaults.get(model, next(iter(defaults.values()))))


def tagged(schema: type, tag: str) -> tuple[str, ...]:
    """The names of the fields of `schema` that carry `tag` (`option(..., tags=...)`)."""
    return tuple(f.name for f in dataclasses.fields(schema) if tag in f.metadata.get("tags", ()))


def part(obj: Any, schema: type) -> Any:
    """The `schema` dataclass holding `obj`'s values of its fields (a layer's share of a config)."""
    return schema(**{f.name: getattr(obj, f.name) for f in dataclasses.fields(schema)})


def check_fields(obj: Any) -> None:
    """Refuse values outside a field's Literal choices or its `option(check=...)` range, naming the
    setting (`name`, which `cli_message` spells as a flag): YAML values skip argparse's checks."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        kind = base_type(hints[f.name])
        if typing.get_origin(kind) is Literal and value not in typing.get_args(kind):
            choices = ", ".join(typing.get_args(kind))
            raise UserError(f"`{f.name}` must be one of {choices}, got {value!r}")
        check = f.metadata.get("check")
        if check is not None and value is not None and not CHECKS[check][0](value):
            raise UserError(f"`{f.name}` {CHECKS[check][1]}, got {value}")


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
    """One flag per field of the dataclass `schema`; choices from Literal types; help from metadata.
    A schema made of other dataclasses (TrainConfig) gets one --help section per part, titled by
    that part's docstring, "title: description"."""
    hints = typing.get_type_hints(schema)
    for title, description, fields in _sections(schema):
        group = parser.add_argument_group(title, description) if title else parser
        for f in fields:
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
            group.add_argument(as_flag(f.name), dest=f.name, **kwargs)


def _sections(schema: type) -> list[tuple[str | None, str | None, list[dataclasses.Field]]]:
    """(title, description, fields) for each dataclass `schema` is made of, base classes first, from
    its docstring, "title: description"; one untitled section for a schema of its own fields only."""
    parts = [c for c in reversed(schema.__mro__[1:]) if dataclasses.is_dataclass(c)]
    if not parts:
        return [(None, None, list(dataclasses.fields(schema)))]
    sections, seen = [], set()
    for part_class in [*parts, schema]:
        fields = [f for f in dataclasses.fields(part_class) if f.name not in seen]
        seen.update(f.name for f in fields)
        if fields:
            title, _, description = (part_class.__doc__ or "").partition(":")
            sections.append((title.strip(), description.strip() or None, fields))
    return sections


def cli_message(err: Exception) -> str:
    """The library names a setting as `name` in its messages; on the command line it is --name."""
    return re.sub(r"`([a-z][a-z0-9_]*)`", lambda found: as_flag(found.group(1)), str(err))


def use_threads(threads: int | None) -> None:
    """Give torch the `--threads` a command was handed (None: torch's own choice); below 1 is a
    UserError naming the flag, before any work; more than the cores this process may use is taken,
    with a warning on stderr (torch's threads then wait on each other: slower, not faster)."""
    if threads is None:
        return
    if threads < 1:
        raise UserError(f"--threads {threads}: must be at least 1")
    import torch  # here, not at the top: --help and the commands without torch stay light

    from seq2seq.machine import cores

    usable = cores()
    if threads > usable:
        print(
            f"warning: --threads {threads} is more than the {usable} cores this process may use: "
            "its threads will wait on each other, slower than with fewer",
            file=sys.stderr,
        )
    torch.set_num_threads(threads)
