"""Translate line by line: `python scripts/translate.py CKPT [--beam 5] < in.txt > out.txt`.

Reads stdin, or `--input FILE` (plain or .gz). One line out per line in, in order; a blank line in gives
a blank line out. Bytes that are not UTF-8 are replaced (U+FFFD) with a warning on stderr naming the
line; so is a line too long for the model, which is cut to fit. `--plot-dir DIR` writes the attention
of each translation, as the search chose it, to DIR/<line>.png (source subwords on x, output on y).
The output formats are described in OUTPUT below (and `--help`).
"""

import argparse
import contextlib
import gzip
import json
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from seq2seq.cli import cli_message
from seq2seq.decoding.flags import decoding_parser, pick_device, search_config
from seq2seq.errors import UserError

CHUNK = 1000  # lines translated together: big enough for full batches, small enough to stream
OUTPUT = """output, for each input line (LINE counts input lines from 0, as Moses n-best lists do):
  default             TEXT
  --scores            LINE ||| TEXT ||| SCORE
  --nbest N           N such lines, best first (fewer if the beam finished fewer); they are
                      ranked by SCORE / ((5 + length) / 6)^alpha (--length-penalty alpha), and
                      SCORE is the total log-probability of the output, EOS included
  --alignments hard   " ||| 0-0 1-2 ..." appended to each line: Pharaoh links, source word -
                      target word, words being whitespace tokens numbered from 0
  --alignments soft   instead, one JSON object per input line: line, text, score, src_tokens,
                      tgt_tokens, attention (target x source subwords, Transformer heads
                      averaged), src_words, tgt_words, word_attention, word_alignment, and
                      nbest (a list of such objects) with --nbest
  Word attention drops the </s> column, so its rows sum to 1 minus the weight on </s>."""


def build_parser() -> argparse.ArgumentParser:
    parser = decoding_parser("Translate text, one line per line, with a checkpoint.")
    raw = (argparse.RawDescriptionHelpFormatter, parser.formatter_class)  # keep OUTPUT's layout
    parser.formatter_class, parser.epilog = type("Formatter", raw, {}), OUTPUT
    parser.add_argument("checkpoint", metavar="CKPT", help="a .ckpt written by scripts/train.py")
    parser.add_argument("--input", metavar="FILE", help="read FILE (plain or .gz), not stdin")
    parser.add_argument("--scores", action="store_true", help="write LINE ||| TEXT ||| SCORE")
    parser.add_argument(
        "--alignments", choices=("none", "hard", "soft"), default="none",
        help="add word alignments: Pharaoh links (hard) or JSON lines with the matrices (soft)",
    )  # fmt: skip
    parser.add_argument(
        "--align-direction", choices=("tgt2src", "src2tgt", "intersect"), default="tgt2src",
        help="hard links: each target word to its best source word, the reverse, or both agree",
    )  # fmt: skip
    parser.add_argument(
        "--plot-dir", metavar="DIR", help="write one alignment heatmap PNG per sentence here"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return translate(args, sys.stdin.buffer, sys.stdout)
    except UserError as err:
        print(f"error: {cli_message(err)}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `translate.py ... | head` closed the pipe: not an error of ours
        sys.stderr.close()
        return 0


def translate(args: argparse.Namespace, stdin: IO[bytes], stdout: IO[str]) -> int:
    search = search_config(args)
    from seq2seq.decoding.translator import Translator

    translator = Translator.load(args.checkpoint, pick_device(args.device))
    with open_input(args.input) if args.input else contextlib.nullcontext(stdin) as source:
        chunk = 1 if source.isatty() else CHUNK  # typing at a terminal: answer each line at once
        for first, lines in read_chunks(source, chunk):
            out = translate_chunk(translator, search, args, first, lines)
            stdout.write("".join(line + "\n" for line in out))
            stdout.flush()
    return 0


def translate_chunk(
    translator: "Translator",  # noqa: F821
    search: "SearchConfig",  # noqa: F821
    args: argparse.Namespace,
    first: int,
    lines: list[str],
) -> list[str]:
    """The output lines for input `lines`, the first of which is line `first` (from 1)."""
    from seq2seq.decoding.translator import TruncatedInput

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", TruncatedInput)
        results = translator.translate(
            lines, search, args.batch_tokens, args.batch_size,
            return_alignments=args.alignments != "none", direction=args.align_direction,
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
        if args.plot_dir and lines[i].strip():
            plot(args.plot_dir, first + i, result)
        out.extend(output_lines(first + i - 1, result, args))
    return out


def output_lines(number: int, result: "Translation", args: argparse.Namespace) -> list[str]:  # noqa: F821
    """The output of input line `number` (from 0), as OUTPUT describes."""
    from seq2seq.alignment.words import format_pharaoh

    if args.alignments == "soft":
        return [json.dumps({"line": number, **result.to_dict(digits=4)}, ensure_ascii=False)]
    lines = []
    for hyp in result.nbest or [result]:
        text = hyp.text.replace("\n", " ")  # one line out per hypothesis, whatever the model says
        fields = (
            [str(number), text, f"{hyp.score:.4f}"] if args.scores or args.nbest > 1 else [text]
        )
        if args.alignments == "hard":
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


if __name__ == "__main__":
    sys.exit(main())
