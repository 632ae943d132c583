"""Translating a stream of lines: one line out per line in, in order, as `seq2seq translate` prints
them (seq2seq.commands.translate describes the formats). Bytes that are not UTF-8 are replaced with a
warning naming the line, and so is a line cut to fit the model; `LineOutput` says what each output
line holds and where the attention plots go.
"""

import contextlib
import gzip
import json
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal

from seq2seq.decoding.search_config import SearchConfig
from seq2seq.errors import UserError

CHUNK = 1000  # lines translated together: big enough for full batches, small enough to stream


@dataclass(frozen=True)
class LineOutput:
    """What each output line holds, and how the lines are batched (the flags of `seq2seq translate`)."""

    scores: bool = False  # LINE ||| TEXT ||| SCORE
    alignments: Literal["none", "hard", "soft"] = "none"  # Pharaoh links, or JSON lines
    align_direction: Literal["tgt2src", "src2tgt", "intersect"] = "tgt2src"
    align_reading: Literal["attention", "foresight"] = "attention"  # Translator.translate's reading
    plot_dir: str | None = None  # one alignment heatmap PNG per sentence here
    batch_tokens: int | None = 4096  # source tokens per batch
    batch_size: int | None = None  # sentences per batch (instead of tokens)


def translate_stream(
    translator: "Translator",  # noqa: F821
    source: IO[bytes],
    out: IO[str],
    search: SearchConfig = SearchConfig(),
    output: LineOutput = LineOutput(),
) -> None:
    """Translate the lines of `source` (bytes, UTF-8) into `out`, a chunk at a time; from a terminal,
    each line as soon as it is typed."""
    chunk = 1 if source.isatty() else CHUNK
    if source.isatty():  # a person typing: say how it goes, and that it waits for them
        print("one sentence a line, each translated when typed; Ctrl-D ends", file=sys.stderr)
    for first, lines in read_chunks(source, chunk):
        written = translate_chunk(translator, search, output, first, lines)
        out.write("".join(line + "\n" for line in written))
        out.flush()


def open_or(path: str | None, stdin: IO[bytes]) -> contextlib.AbstractContextManager[IO[bytes]]:
    """`path` opened (see `open_input`), or `stdin` left open."""
    return open_input(path) if path else contextlib.nullcontext(stdin)


def translate_chunk(
    translator: "Translator",  # noqa: F821
    search: SearchConfig,
    output: LineOutput,
    first: int,
    lines: list[str],
) -> list[str]:
    """The output lines for input `lines`, the first of which is line `first` (from 1)."""
    from seq2seq.decoding.translator import TruncatedInput

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", TruncatedInput)
        results = translator.translate(
            lines, search, output.batch_tokens, output.batch_size,
            return_alignments=output.alignments != "none", direction=output.align_direction,
            reading=output.align_reading,
        )  # fmt: skip
    for warning in caught:  # ours name the line; others pass through unchanged
        if isinstance(warning.message, TruncatedInput):
            line = first + warning.message.index
            print(f"warning: line {line}: {warning.message.detail}", file=sys.stderr)
        else:
            warnings.showwarning(
                warning.message, warning.category, warning.filename, warning.lineno
            )
    out = []
    for i, result in enumerate(results):
        if output.plot_dir and lines[i].strip():
            plot(output.plot_dir, first + i, result)
        out.extend(output_lines(first + i - 1, result, output, search.nbest))
    return out


def output_lines(
    number: int,
    result: "Translation",  # noqa: F821
    output: LineOutput,
    nbest: int = 1,
) -> list[str]:
    """The output of input line `number` (from 0), as OUTPUT describes."""
    from seq2seq.alignment.words import format_pharaoh

    if output.alignments == "soft":
        return [json.dumps({"line": number, **result.to_dict(digits=4)}, ensure_ascii=False)]
    lines = []
    for hyp in result.nbest or [result]:
        text = hyp.text.replace("\n", " ")  # one line out per hypothesis, whatever the model says
        fields = [str(number), text, f"{hyp.score:.4f}"] if output.scores or nbest > 1 else [text]
        if output.alignments == "hard":
            fields.append(format_pharaoh(hyp.word_alignment))
        lines.append(" ||| ".join(fields))
    return lines


def open_input(path: str) -> IO[bytes]:
    """`path` opened for reading bytes, gunzipped when it ends in .gz; a file that cannot be read, or
    a .gz file that is not gzip, is a UserError now rather than a traceback at the first line."""
    try:
        raw = open(path, "rb")  # noqa: SIM115 - the caller closes it
    except OSError as err:
        raise UserError(f"--input {path}: cannot read ({err.strerror})") from None
    if not path.endswith(".gz"):
        return raw
    if raw.peek(2)[:2] != b"\x1f\x8b":  # gzip's magic number
        raw.close()
        raise UserError(f"--input {path}: not a gzip file (rename it without .gz if it is text)")
    return gzip.GzipFile(fileobj=raw, mode="rb")


def read_chunks(stdin: IO[bytes], size: int) -> Iterator[tuple[int, list[str]]]:
    """(number of the first line, up to `size` decoded lines); bad bytes are replaced with a warning."""
    lines: list[str] = []
    first = 1
    for number, raw in enumerate(_lines_of(stdin), start=1):
        raw = raw.removesuffix(b"\n").removesuffix(b"\r")
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            line = raw.decode("utf-8", errors="replace")
            print(
                f"warning: line {number}: bytes that are not UTF-8 replaced with U+FFFD",
                file=sys.stderr,
            )
        lines.append(line.removeprefix("\ufeff") if number == 1 else line)
        if len(lines) == size:
            yield first, lines
            first, lines = number + 1, []
    if lines:
        yield first, lines


def _lines_of(source: IO[bytes]) -> Iterator[bytes]:
    """The raw lines of `source`; a gzip stream that breaks off is a UserError naming the line."""
    number = 0
    try:
        for number, raw in enumerate(source, start=1):  # noqa: B007 - read in the except
            yield raw
    except (OSError, EOFError) as err:  # BadGzipFile is an OSError
        raise UserError(f"--input: unreadable after line {number} ({err})") from None


def plot(folder: str, number: int, result: "Translation") -> None:  # noqa: F821
    """Save the alignment of line `number` as `<folder>/<number>.png` (source on x, output on y)."""
    from seq2seq.alignment.plotting import alignment_figure, save_figure

    figure = alignment_figure(
        result.attention, result.src_tokens, result.tgt_tokens, f"line {number}",
        result.alignment_head,
    )  # fmt: skip
    try:
        save_figure(figure, Path(folder) / f"{number:06d}.png")
    except OSError as err:
        raise UserError(f"--plot-dir {folder}: cannot write ({err.strerror})") from None
