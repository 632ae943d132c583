"""`--config FILE`: a YAML mapping of a config dataclass's fields, checked key by key and value by value
against the dataclass's annotations before anything else runs, each error naming the file and line.

Argparse checks the types of flags; YAML values skip argparse, so without this a `devices: 2` (an int
where the dataclass says str) or `lr: fast` surfaced as a traceback minutes later, after preparation.
Dashes and underscores are interchangeable in keys; a key given twice is refused (YAML would keep the
last without a word). A whole number is accepted where a float or a string is expected (`lr: 1`,
`devices: 2`), nothing else is converted.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml

from seq2seq.errors import UserError


class Loader(yaml.SafeLoader):
    """YAML 1.1's safe loader, except that `1e-3` is a float, as in YAML 1.2 and in every config
    people write (YAML 1.1 reads it as a string: its floats need a dot, `1.0e-3`)."""


Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
        |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


def load_yaml(path: str, flag: str = "--config") -> tuple[Any, Any]:
    """The node tree (None for an empty file) and the values of YAML file `path`; an unreadable
    file or invalid YAML is a UserError naming `flag` and the file."""
    try:
        text = Path(path).read_text(encoding="utf-8")
        node = yaml.compose(text, Loader=Loader)  # the node tree keeps each key's line
    except OSError as err:
        raise UserError(f"{flag} {path}: cannot read it ({err.strerror})") from None
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise UserError(f"{flag} {path}: not valid YAML ({str(err).splitlines()[0]})") from None
    refuse_repeated_keys(node, f"{flag} {path}")
    return node, yaml.load(text, Loader=Loader)


def refuse_repeated_keys(root: yaml.Node | None, where: str) -> None:
    """A UserError for a key given twice in one mapping, anywhere in the tree: YAML loaders keep
    the last and drop the first without a word. In the top mapping, whose keys name flags, dashes
    and underscores count as one (`max-epochs`, `max_epochs`), as they do when the keys are read."""
    stack, seen = [(root, True)], set()
    while stack:
        node, top = stack.pop()
        if node is None or id(node) in seen:  # an alias may point back up the tree
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            lines: dict[str, int] = {}
            for key, value in node.value:
                name, line = str(key.value), key.start_mark.line + 1
                name = name.replace("-", "_") if top else name
                if isinstance(key, yaml.ScalarNode) and name in lines:
                    raise UserError(
                        f"{where} line {line}: {key.value!r} is given twice (line {lines[name]} "
                        "too); keep one"
                    )
                lines[name] = line
                stack.append((value, False))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((item, False) for item in node.value)


def read_yaml(path: str, schema: type) -> dict[str, Any]:
    """The values of YAML file `path` by field name of the dataclass `schema`.

    Raises UserError naming the file (and line) for an unreadable file, invalid YAML, a document that
    is not a mapping, an unknown key, or a value of the wrong type.
    """
    node, data = load_yaml(path)
    if node is None:
        return {}
    if not isinstance(node, yaml.MappingNode):
        raise UserError(f"--config {path}: expected a mapping of flag names to values")
    hints = typing.get_type_hints(schema)
    fields = {f.name for f in dataclasses.fields(schema)}
    values = {}
    for key_node, _ in node.value:
        key, line = key_node.value, key_node.start_mark.line + 1
        name = str(key).replace("-", "_")
        where = f"--config {path} line {line}"
        if name not in fields:
            raise UserError(f"{where}: unknown key {key!r}")
        values[name] = checked_value(data[key], hints[name], f"{where}: {key}")
    return values


def checked_value(value: Any, annotation: Any, what: str) -> Any:
    """`value` if it fits `annotation` (int where float or str is expected becomes one), else a
    UserError that starts with `what`. The one rule for a YAML file's values and a library caller's
    (`seq2seq.training.config.validate`)."""
    optional, kind = _unwrap(annotation)
    if value is None:
        if optional:
            return None
        raise UserError(f"{what} needs a value")
    if typing.get_origin(kind) is Literal:
        choices = typing.get_args(kind)
        if value not in choices:
            raise UserError(f"{what} must be one of {', '.join(map(str, choices))}, got {value!r}")
        return value
    if kind is bool:
        if isinstance(value, bool):
            return value
        raise UserError(f"{what} must be true or false, got {value!r}")
    if isinstance(value, bool):  # YAML's yes/no/true are bools, never numbers or names here
        raise UserError(f"{what} must be {_NAMES[kind]}, got {value!r}")
    if kind is int and isinstance(value, int):
        return value
    if kind is float and isinstance(value, int | float):
        return float(value)
    if kind is str and isinstance(value, str | int):
        return str(value)
    raise UserError(f"{what} must be {_NAMES[kind]}, got {value!r}")


_NAMES = {int: "a whole number", float: "a number", str: "a string"}


def _unwrap(annotation: Any) -> tuple[bool, Any]:
    """(None allowed, the other type): int | None -> (True, int)."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        others = [a for a in typing.get_args(annotation) if a is not type(None)]
        return len(others) < len(typing.get_args(annotation)), others[0]
    return False, annotation
