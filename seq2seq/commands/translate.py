"""Translate line by line: `seq2seq translate CKPT [--beam 5] < in.txt > out.txt` (or
`python scripts/translate.py ...`); the procedure is seq2seq.decoding.stream.translate_stream.

Reads stdin, or `--input FILE` (plain or .gz): from a terminal, each line is translated as it is typed
(Ctrl-D ends). One line out per line in, in order; a blank line in gives a blank line out. Bytes that
are not UTF-8 are replaced (U+FFFD) with a warning on stderr naming the line; so is a line too long for
the model, which is cut to fit. `--plot-dir DIR` writes the attention of each translation, as the
search chose it, to DIR/<line>.png (source subwords on x, output on y).
The output formats are described in OUTPUT below (and `--help`).

`--align-reading foresight` reads the alignments from the checkpoint's foresight head (`seq2seq
fit-foresight`), teacher-forced on each translation. `--reverse CKPT2`, a checkpoint of the other
direction, reads each translation back (translation -> source) and the links of both directions are
joined (`--join`, grow-diag-final-and by default): seq2seq.alignment.joined.
"""

import argparse
import sys
from typing import IO

from seq2seq.alignment.words import JOINS
from seq2seq.cli import cli_message
from seq2seq.decoding.flags import (
    add_reading_flags,
    decoding_parser,
    pick_device,
    refuse_unread,
    search_config,
)
from seq2seq.decoding.stream import LineOutput, open_or, translate_stream
from seq2seq.errors import UserError

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
  Word attention drops the </s> column, so its rows sum to 1 minus the weight on </s>.
  The JSON's "reading" names what the links were read from: attention, foresight, or
  joined:METHOD with --reverse (its matrices stay the forward model's)."""


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    parser = decoding_parser("Translate text, one line per line, with a checkpoint.", prog)
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
    add_reading_flags(
        parser, "a checkpoint of the other direction: join the links of both (each translation "
        "read back, teacher-forced)",
    )  # fmt: skip
    parser.add_argument(
        "--join", choices=JOINS, default="grow-diag-final-and",
        help="how --reverse joins the two directions' links",
    )  # fmt: skip
    parser.add_argument(
        "--plot-dir", metavar="DIR", help="write one alignment heatmap PNG per sentence here"
    )
    return parser


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    try:
        if args.alignments == "none":  # each of these shapes the alignments alone
            flags = ("reverse", "align_reading", "align_direction", "join")
            refuse_unread(
                parser, args, flags, "is for word alignments: give --alignments hard or soft too"
            )
        if not args.reverse:
            refuse_unread(
                parser, args, ("join",), "joins --reverse's links: give --reverse CKPT2 too"
            )
        return translate(args, sys.stdin.buffer, sys.stdout)
    except UserError as err:
        print(f"error: {cli_message(err)}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `translate.py ... | head` closed the pipe: not an error of ours
        sys.stderr.close()
        return 0


def translate(args: argparse.Namespace, stdin: IO[bytes], stdout: IO[str]) -> int:
    search = search_config(args)
    from seq2seq.alignment.joined import JoinedTranslator
    from seq2seq.decoding.evaluate import check_heads, check_reverse
    from seq2seq.decoding.translator import Translator

    if args.reverse:  # the other direction's model, as evaluate --reverse asks
        from seq2seq.checkpoint import corpus_of, read_checkpoint

        check_reverse(corpus_of(read_checkpoint(args.checkpoint)), args.reverse)

    output = LineOutput(
        scores=args.scores,
        alignments=args.alignments,
        align_direction=args.align_direction,
        align_reading=args.align_reading,
        plot_dir=args.plot_dir,
        batch_tokens=args.batch_tokens,
        batch_size=args.batch_size,
    )
    device = pick_device(args.device)
    translator = Translator.load(args.checkpoint, device)
    reverse = Translator.load(args.reverse, device) if args.reverse else None
    check_heads(args.align_reading, [(args.checkpoint, translator), (args.reverse, reverse)])
    if reverse is not None:
        translator = JoinedTranslator(translator, reverse, args.join)
    with open_or(args.input, stdin) as source:
        translate_stream(translator, source, stdout, search, output)
    return 0
