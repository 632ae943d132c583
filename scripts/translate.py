"""Translate standard input line by line: `python scripts/translate.py CKPT [--beam 5] < in.txt > out.txt`.

One line out per line in, in order; a blank line in gives a blank line out. Bytes that are not UTF-8 are
replaced (U+FFFD) with a warning on stderr naming the line. `--plot-dir DIR` writes the attention of each
translation, as the search chose it, to DIR/<line>.png (source subwords on x, output subwords on y).
"""

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from seq2seq.errors import UserError
from seq2seq.search import add_search_flags, check_search_flags, translate_lines

CHUNK = 1000  # lines translated together: big enough for full batches, small enough to stream


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Translate stdin to stdout, one line per line, with a trained checkpoint.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("checkpoint", metavar="CKPT", help="a .ckpt written by scripts/train.py")
    add_search_flags(parser)
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
    check_search_flags(args)
    from seq2seq.system import load_system, pick_device

    system = load_system(args.checkpoint).to(pick_device(args.device))
    tokenizer = system.tokenizer
    chunk = 1 if stdin.isatty() else CHUNK  # typing at a terminal: answer each line at once
    for first, lines in read_chunks(stdin, chunk):
        out, kept, hyps = translate_lines(system.model, tokenizer, lines, args)
        for j, i in enumerate(kept):
            out[i] = out[i].replace("\n", " ")  # one line out per line in, whatever the model says
            if args.plot_dir:
                plot(args.plot_dir, first + i, tokenizer, lines[i], hyps.tokens[j], hyps.weights[j])
        stdout.write("".join(line + "\n" for line in out))
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


def plot(
    folder: str, number: int, tokenizer: Any, source: str, ids: list[int], weights: Any
) -> None:
    """Save the alignment of line `number` as `<folder>/<number>.png` (weights (len + 1, [N,] S))."""
    from seq2seq.plotting import alignment_figure, save_figure

    src_tokens = [*tokenizer.pieces(tokenizer.encode(source)), "</s>"]
    tgt_tokens = [*tokenizer.pieces(ids), "</s>"]
    figure = alignment_figure(weights, src_tokens, tgt_tokens, title=f"line {number}")
    try:
        save_figure(figure, Path(folder) / f"{number:06d}.png")
    except OSError as err:
        raise UserError(f"--plot-dir {folder}: cannot write ({err.strerror})") from None


if __name__ == "__main__":
    sys.exit(main())
