"""Score a checkpoint with sacreBLEU: `python scripts/evaluate.py CKPT [--split test] [--beam 5]`.

The checkpoint alone is enough with `--src-file S --ref-file R`; with `--split`, the corpus named in the
checkpoint's config is read again (data/<name>/, ../shared/data/<name>/ or the hub). Prints BLEU and chrF
with their signatures, the number of sentences and sentences/second, and writes the hypotheses (one per
line, in input order) to `--out`, by default next to the checkpoint.
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

from seq2seq.config import decoding_parser, pick_device, search_config
from seq2seq.errors import UserError


def build_parser() -> argparse.ArgumentParser:
    parser = decoding_parser("Translate a test set with a checkpoint and score it with sacreBLEU.")
    parser.add_argument("checkpoint", metavar="CKPT", help="a .ckpt written by scripts/train.py")
    parser.add_argument(
        "--split",
        default="test",
        help="split of the training corpus (val, test, test_2017_flickr, ...)",
    )
    parser.add_argument(
        "--src-file", metavar="S", help="source sentences, one per line (instead of --split)"
    )
    parser.add_argument("--ref-file", metavar="R", help="references, line-aligned with --src-file")
    parser.add_argument(
        "--out", metavar="FILE", help="hypotheses file (default: beside the checkpoint)"
    )
    parser.add_argument(
        "--json", metavar="FILE", help="also write the results as JSON ('-': stdout)"
    )
    parser.add_argument("--lowercase", action="store_true", help="case-insensitive BLEU")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        result = evaluate(args)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    report(result, args.json)
    return 0


def evaluate(args: argparse.Namespace) -> dict[str, Any]:
    """Translate, score and write the hypotheses; returns the results as a JSON-ready dict."""
    search = check_flags(args)
    from seq2seq.checkpoint import corpus_of, read_checkpoint
    from seq2seq.metrics import corpus_bleu, corpus_chrf
    from seq2seq.translator import Translator

    device = pick_device(args.device)
    files = read_files(args) if args.src_file is not None else None  # bad files fail fast
    translator = Translator.load(args.checkpoint, device)
    sources, references, data = files or read_split(
        args, corpus_of(read_checkpoint(args.checkpoint))
    )
    if not sources:
        raise UserError(f"no sentences to evaluate in {data}")
    start = time.perf_counter()
    results = translator.translate(sources, search, args.batch_tokens, args.batch_size)
    hypotheses = [result.text for result in results]
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    out = write_lines(hypotheses, args.out or default_out(args))
    bleu = corpus_bleu(hypotheses, references, lowercase=args.lowercase)
    chrf = corpus_chrf(hypotheses, references)
    result = {
        "checkpoint": str(args.checkpoint),
        "data": data,
        "bleu": bleu.value,
        "bleu_signature": bleu.signature,
        "chrf": chrf.value,
        "chrf_signature": chrf.signature,
        "sentences": len(sources),
        "seconds": seconds,
        "sentences_per_second": len(sources) / max(seconds, 1e-9),
        "beam": args.beam,
        "length_penalty": args.length_penalty,
        "device": str(device),
        "hypotheses": str(out),
    }
    if args.json and args.json != "-":
        write_lines([json.dumps(result, indent=2)], args.json, "--json")
    return result


def check_flags(args: argparse.Namespace) -> "SearchConfig":  # noqa: F821
    if (args.src_file is None) != (args.ref_file is None):
        raise UserError("--src-file and --ref-file go together")
    return search_config(args)


def read_files(args: argparse.Namespace) -> tuple[list[str], list[str], str]:
    """Sources, references and a description of them, from --src-file and --ref-file."""
    from seq2seq.corpus import read_lines

    sources, references = read_lines(args.src_file), read_lines(args.ref_file)
    if len(sources) != len(references):
        raise UserError(
            f"{args.src_file} has {len(sources)} lines but {args.ref_file} has {len(references)}"
        )
    return sources, references, f"{args.src_file} -> {args.ref_file}"


def read_split(args: argparse.Namespace, corpus: dict | None) -> tuple[list[str], list[str], str]:
    """Sources, references and a description of them, from --split of the checkpoint's corpus."""
    from seq2seq.corpus import read_pairs, resolve_corpus

    if corpus is None:
        raise UserError("the checkpoint names no corpus: give --src-file and --ref-file")
    src, tgt = corpus["src"], corpus["tgt"]
    try:
        source = resolve_corpus(corpus["dataset"], corpus["data_dir"])
        split = source.find_split(args.split)
        pairs = read_pairs(source, split, src, tgt)
    except UserError as err:
        raise UserError(
            f"--split {args.split}: {err} (or give --src-file and --ref-file)"
        ) from None
    return pairs.src, pairs.tgt, f"{source.location} {split} ({src}-{tgt})"


def default_out(args: argparse.Namespace) -> Path:
    """`<ckpt stem>.<split or src file>.beam<K>.hyp` beside the checkpoint; ./hyps.txt if that is read-only."""
    data = Path(args.src_file).name if args.src_file else args.split
    path = Path(args.checkpoint).with_name(
        f"{Path(args.checkpoint).stem}.{data}.beam{args.beam}.hyp"
    )
    return path if os.access(path.parent, os.W_OK) else Path("hyps.txt")


def write_lines(lines: list[str], path: str | Path, flag: str = "--out") -> Path:
    path = Path(path)
    try:
        path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    except OSError as err:
        raise UserError(f"{flag} {path}: cannot write ({err.strerror})") from None
    return path


def report(result: dict[str, Any], json_path: str | None) -> None:
    """Human-readable lines on stdout (BLEU to 2 decimals, as `sacrebleu -b` prints it); JSON if asked."""
    lines = [
        f"data: {result['data']}",
        f"BLEU = {result['bleu']:.2f}  {result['bleu_signature']}",
        f"chrF = {result['chrf']:.2f}  {result['chrf_signature']}",
        f"sentences: {result['sentences']}  {result['sentences_per_second']:.1f} sentences/s "
        f"({result['seconds']:.2f} s, beam {result['beam']}, {result['device']})",
        f"hypotheses: {result['hypotheses']}",
    ]
    if json_path == "-":  # stdout is the JSON alone, so it pipes into jq
        print(json.dumps(result, indent=2))
        print("\n".join(lines), file=sys.stderr)
    else:
        print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
