"""Every command the README and the pages give (`python scripts/X.py ...`, `python -m seq2seq ...`,
`seq2seq ...`, `python docs/tools/<tool>.py ...`, in code blocks and inline code) is read by that
program's own parser, as a user who pastes it would have it read: a flag renamed or removed, or a
value a flag no longer takes, fails here. The program stops once its flags are read; nothing runs.

Shell around a command is dropped before it is read: redirections, `${...}`, `...`, the brackets
of an optional part (`[--beam N]` is read as `--beam N`), and all but the first of alternatives
written `a|b` or `run/one/status`; `$VAR` stands as a value. A value in capitals (`--score SCORE`,
`--updates N`) is a placeholder, and a command named in prose may leave out its positional
arguments: what is checked is that every flag is known and takes the value given."""

import argparse
import contextlib
import io
import re
import runpy
import shlex
import sys

import pytest

from seq2seq.commands import COMMANDS
from seq2seq.commands import main as seq2seq_main
from seq2seq.training.config import build_parser as train_parser
from tests.conftest import ROOT
from tests.unit.test_docs import PAGES, prose_and_code

# Programs whose flags they do not know go on to train.py's parser (their epilog: "Others: train.py's").
TRAIN_FLAGS_AFTER = {
    "scripts/benchmark.py",
    "scripts/benchmark_memory.py",
    "scripts/benchmark_scale.py",
    "docs/tools/profile_update.py",
}
SEPARATORS = {"|", "||", "&&", ";", "&"}


class FlagsRead(Exception):
    """Raised in place of a program's work once its first parser has read the flags."""

    def __init__(self, rest: list[str]) -> None:
        self.rest = rest


def lines_of_code(page) -> list[str]:
    """The page's code, a fenced line continued with a backslash joined to the next."""
    joined, out = "", []
    for line in prose_and_code(page)[1]:
        if line.rstrip().endswith("\\"):
            joined += line.rstrip()[:-1] + " "
            continue
        out.append(joined + line)
        joined = ""
    return out


def cleaned(words: list[str]) -> list[str]:
    """`words` without the shell around a command (the module docstring)."""
    out, skip, braced = [], False, False
    for word in words:
        if braced or word.startswith("${"):  # `${last:+--resume "$last"}`, to its brace
            braced = not word.endswith("}")
            continue
        if skip:
            skip = False
            continue
        if re.fullmatch(r"\d?[<>]&?\d?", word):  # `< in.de`, `> out.en`, `2>&1`
            skip = not word.endswith(tuple("0123456789"))
            continue
        if word.startswith(("<", ">", "2>")) or word in ("...", "…"):
            continue
        word = word.strip("[]").split("|")[0] if word not in SEPARATORS else word
        if re.fullmatch(r"[a-z-]+(/[a-z-]+)+", word):  # `run/one/status` (a path has a dot)
            word = word.split("/")[0]
        if word:
            out.append(word)
    return out


def commands(page) -> list[tuple[str, list[str]]]:
    """(program, argv) of each command the page gives: program is a script's path from the
    repository's root or a seq2seq command's name."""
    found = []
    for line in lines_of_code(page):
        try:
            words = shlex.split(re.sub(r"^\s*\$ ", "", line), comments=True)
        except ValueError:  # not shell (an unclosed quote in prose-like code)
            continue
        words = [part for word in words for part in re.split(r"(;)$", word) if part]  # `$p; done`
        start = 0
        for i, word in enumerate([*words, ";"]):
            if word not in SEPARATORS:
                continue
            part, start = words[start:i], i + 1
            for j, w in enumerate(part):
                rest = part[j + 1 :]
                if w in ("python", "python3") and rest[:2] == ["-m", "seq2seq"] and len(rest) > 2:
                    name = rest[2].split("|")[0]  # `train|evaluate`
                    if name.startswith("-") or name.isupper():  # --help, COMMAND
                        break
                    found.append((name, cleaned(rest[3:])))
                elif (
                    w in ("python", "python3")
                    and rest
                    and rest[0].startswith(("scripts/", "docs/tools/"))
                ):
                    found.append((rest[0], cleaned(rest[1:])))
                elif w == "seq2seq" and j == 0 and rest and rest[0] in COMMANDS:
                    found.append((rest[0], cleaned(rest[1:])))
                else:
                    continue
                break
    return found


CASES = [(page, program, argv) for page in PAGES for program, argv in commands(page)]


def read_flags(program: str, argv: list[str]) -> list[str]:
    """Run `program` with `argv` until its first parser has read them; the flags it left to others.
    SystemExit from argparse (a refused flag) passes through."""
    original = argparse.ArgumentParser.parse_known_args
    depth = 0

    def parse_known_args(self, args=None, namespace=None):
        nonlocal depth
        depth += 1
        try:
            result = original(self, args, namespace)
        finally:
            depth -= 1
        if depth == 0:  # the program's parser, its subcommands' read inside it
            raise FlagsRead(result[1])
        return result

    argparse.ArgumentParser.parse_known_args = parse_known_args
    saved = sys.argv
    try:
        if program in COMMANDS:
            sys.argv = ["seq2seq", program, *argv]
            seq2seq_main([program, *argv])
        else:
            sys.argv = [program, *argv]
            runpy.run_path(str(ROOT / program), run_name="__main__")
    except FlagsRead as read:
        return read.rest
    finally:
        argparse.ArgumentParser.parse_known_args = original
        sys.argv = saved
    raise AssertionError(f"{program} returned before reading its flags")


def placeholder(message: str) -> bool:
    """A refusal that is the page's shorthand, not a wrong flag: a value in capitals (`--score
    SCORE`, `--updates N`), or positional arguments left out of a command named in prose."""
    last = message.splitlines()[-1] if message else ""
    return bool(re.search(r"'[A-Z][A-Z_0-9]*'", last)) or "arguments are required:" in last


@pytest.mark.parametrize(
    "page, program, argv",
    CASES,
    ids=[f"{p.relative_to(ROOT)}:{prog} {' '.join(a)[:40]}" for p, prog, a in CASES],
)
def test_a_command_the_pages_give_is_read_by_its_program(page, program, argv) -> None:
    assert program in COMMANDS or (ROOT / program).exists(), f"{page.name}: no {program}"
    err = io.StringIO()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            rest = read_flags(program, argv)
            if program in TRAIN_FLAGS_AFTER:
                rest = train_parser().parse_known_args(rest)[1]
    except SystemExit as stop:  # argparse's refusal, or --help's exit 0
        message = err.getvalue().strip()
        assert stop.code in (0, None) or placeholder(message), f"{page.name}: {message}"
        return
    assert rest == [], f"{page.name}: {program} does not know {rest}"


def test_the_pages_give_commands_of_every_kind() -> None:
    """The reading above finds what it should: scripts, seq2seq commands and tools, and one
    through a pipe."""
    programs = {program for _, program, _ in CASES}
    assert {
        "scripts/train.py",
        "train",
        "fit-foresight",
        "docs/tools/readings_report.py",
    } <= programs
    readme = dict((p, a) for p, a in commands(ROOT / "README.md") if p == "scripts/translate.py")
    assert readme and all("<" not in w for w in readme["scripts/translate.py"])
