"""Translate standard input line by line: `python scripts/translate.py CKPT [--beam 5] < in.txt > out.txt`.

One line out per line in, in order; a blank line in gives a blank line out. Bytes that are not UTF-8 are
replaced (U+FFFD) with a warning on stderr naming the line. `--plot-dir DIR` writes the attention of each
translation, as the search chose it, to DIR/<line>.png (source subwords on x, output subwords on y).
"""

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from seq2seq.config import decoding_parser, pick_device, search_config
from seq2seq.errors import UserError

CHUNK = 1000  # lines translated together: big enough for full batches, small enough to stream


def build_parser() -> argparse.ArgumentParser:
    parser = decoding_parser("Translate stdin to stdout, one line per line, with a checkpoint.")
    parser.add_argument("checkpoint", metavar="CKPT", help="a .ckpt written by scripts/train.py")
    parser.add_argument(
        "--plot-dir", metavar="DIR", help="write one alignment heatmap PNG per sentence here"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return translate(args, sys.stdin.buffer, sys.stdout)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `translate.py ... | head` closed the pipe: not an error of ours
        sys.stderr.close()
        return 0


def translate(args: argparse.Namespace, stdin: IO[bytes], stdout: IO[str]) -> int:
    search = search_config(args)
    from seq2seq.translator import Translator

    translator = Translator.load(args.checkpoint, pick_device(args.device))
    chunk = 1 if stdin.isatty() else CHUNK  # typing at a terminal: answer each line at once
    for first, lines in read_chunks(stdin, chunk):
        results = translator.translate(lines, search, args.batch_tokens, args.batch_size)
        for i, result in enumerate(results):
            if args.plot_dir and lines[i].strip():
                plot(args.plot_dir, first + i, result)
        # One line out per line in, whatever the model says.
        stdout.write("".join(result.text.replace("\n", " ") + "\n" for result in results))
        stdout.flush()
    return 0


def read_chunks(stdin: IO[bytes], size: int) -> Iterator[tuple[int, list[str]]]:
    """(number of the first line, up to `size` decoded lines); bad bytes are replaced with a warning."""
    lines: list[str] = []
    first = 1
    for number, raw in enumerate(stdin, start=1):
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


def plot(folder: str, number: int, result: "Translation") -> None:  # noqa: F821
    """Save the alignment of line `number` as `<folder>/<number>.png` (source on x, output on y)."""
    from seq2seq.plotting import alignment_figure, save_figure

    figure = alignment_figure(
        result.attention, result.src_tokens, result.tgt_tokens, title=f"line {number}"
    )
    try:
        save_figure(figure, Path(folder) / f"{number:06d}.png")
    except OSError as err:
        raise UserError(f"--plot-dir {folder}: cannot write ({err.strerror})") from None


if __name__ == "__main__":
    sys.exit(main())
