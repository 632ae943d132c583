"""Fit a foresight head on a trained GRU translator: `seq2seq fit-foresight CKPT --out CKPT2`.

The translator is frozen; a small head whose query has read the target piece it aligns learns, in a
few hundred updates on the checkpoint's training corpus, to predict each piece from the source words
its weights read (seq2seq.models.foresight, seq2seq.alignment.foresight). The head goes into a copy of
the checkpoint (`--out`), written whole or not at all, which translates exactly as the original does
and also reads alignments as `foresight` (`evaluate --align-reading foresight`, `translate
--align-reading foresight`, `Translator.align(..., reading="foresight")`). The original is not changed.

Prints the updates, the loss at the start and at the end, the pairs read and the fit's wall time.
"""

import argparse
import sys

import torch

from seq2seq.atomic import check_writable_file
from seq2seq.cli import cli_message, use_threads
from seq2seq.errors import UserError


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    from seq2seq.alignment.foresight import FitSettings

    defaults = FitSettings()
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Fit a foresight alignment head on a frozen GRU translator; write a copy of "
        "the checkpoint with the head inside.",
    )
    parser.add_argument("checkpoint", metavar="CKPT", help="a .ckpt of a GRU translator")
    parser.add_argument("--out", metavar="CKPT2", required=True, help="the copy to write")
    parser.add_argument("--split", default="train", help="the corpus split to fit on (train)")
    parser.add_argument("--src-file", metavar="S", help="fit on these sources instead ...")
    parser.add_argument("--tgt-file", metavar="T", help="... and these targets, line-aligned")
    parser.add_argument(
        "--steps", type=int, default=defaults.steps, help=f"updates (default {defaults.steps})"
    )
    parser.add_argument(
        "--batch-tokens", type=int, default=defaults.batch_tokens,
        help=f"padded tokens a batch (default {defaults.batch_tokens})",
    )  # fmt: skip
    parser.add_argument(
        "--lr", type=float, default=defaults.lr, help=f"Adam's rate (default {defaults.lr})"
    )
    parser.add_argument("--seed", type=int, default=defaults.seed, help="initial weights, order")
    parser.add_argument(
        "--threads", type=int, default=None, help="CPU threads (default: torch's choice)"
    )
    return parser


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    args = build_parser(prog).parse_args(argv)
    try:
        fit_and_write(args)
    except UserError as err:
        print(f"error: {cli_message(err)}", file=sys.stderr)
        return 2
    return 0


def fit_and_write(args: argparse.Namespace) -> None:
    """Read the pairs, fit the head, write the copy; bad input is a UserError before the fit."""
    from seq2seq.alignment.foresight import (
        CHECKPOINT_KEY,
        FitSettings,
        fit_foresight,
        head_record,
        pair_batches,
    )
    from seq2seq.checkpoint import atomic_save, corpus_of, read_checkpoint
    from seq2seq.decoding.evaluate import read_files, read_split
    from seq2seq.decoding.flags import refuse_unread
    from seq2seq.decoding.loading import load_model

    settings = FitSettings(args.steps, args.batch_tokens, args.lr, args.seed)
    settings.check()
    use_threads(args.threads)
    if (args.src_file is None) != (args.tgt_file is None):
        raise UserError("--src-file and --tgt-file go together")
    if args.src_file is not None:
        refuse_unread(
            build_parser(), args, ["split"], "names a corpus split: --src-file's are read"
        )
    inputs = (args.checkpoint, args.src_file, args.tgt_file)  # the original is never replaced
    check_writable_file(args.out, f"--out {args.out}", inputs)  # before the minutes of the fit
    checkpoint = read_checkpoint(args.checkpoint)
    model, tokenizer = load_model(args.checkpoint)
    if args.src_file is not None:
        sources, (targets,), data = read_files(args.src_file, [args.tgt_file])
    else:
        sources, (targets,), data = read_split(
            args.split, corpus_of(checkpoint), instead=" (or give --src-file and --tgt-file)"
        )
    batches = pair_batches(
        tokenizer.encode_batch(sources), tokenizer.encode_batch(targets),
        settings.batch_tokens, settings.seed,
    )  # fmt: skip
    fit = fit_foresight(model, batches, settings)
    checkpoint[CHECKPOINT_KEY] = head_record(fit, settings, data)
    try:
        atomic_save(checkpoint, args.out)
    except OSError as err:
        raise UserError(f"--out {args.out}: cannot write ({err.strerror})") from None
    losses = fit.losses
    print(f"data: {data} ({len(sources):,} pairs)")
    print(
        f"fitted: {len(losses)} updates, loss {losses[0]:.3f} -> {losses[-1]:.3f} (mean of the "
        f"last 10: {sum(losses[-10:]) / len(losses[-10:]):.3f}), {fit.target_tokens:,} target "
        f"pieces, {fit.seconds:.1f} s ({fit.cpu_seconds:.1f} s of CPU) on {torch.get_num_threads()} "
        "thread(s)"
    )
    print(f"written: {args.out}")
