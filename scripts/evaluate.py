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

from seq2seq.errors import UserError
from seq2seq.search import add_search_flags, check_search_flags, translate_lines


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Translate a test set with a checkpoint and score it with sacreBLEU.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("checkpoint", metavar="CKPT", help="a .ckpt written by scripts/train.py")
    parser.add_argument(
        "--split", choices=("val", "test"), default="test", help="split of the training corpus"
    )
    parser.add_argument(
        "--src-file", metavar="S", help="source sentences, one per line (instead of --split)"
    )
    parser.add_argument("--ref-file", metavar="R", help="references, line-aligned with --src-file")
    add_search_flags(parser)
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
    check_flags(args)
    import seq2seq.data  # noqa: F401  imported here so that the timing below is decoding alone
    from seq2seq.metrics import corpus_bleu, corpus_chrf
    from seq2seq.system import load_system, pick_device

    device = pick_device(args.device)
    files = read_files(args) if args.src_file is not None else None  # bad files fail fast
    system = load_system(args.checkpoint, map_location="cpu").to(device)
    sources, references, data = files or read_split(args, system.cfg)
    if not sources:
        raise UserError(f"no sentences to evaluate in {data}")
    start = time.perf_counter()
    hypotheses = translate_lines(system.model, system.tokenizer, sources, args)[0]
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


def check_flags(args: argparse.Namespace) -> None:
    if (args.src_file is None) != (args.ref_file is None):
        raise UserError("--src-file and --ref-file go together")
    check_search_flags(args)


def read_files(args: argparse.Namespace) -> tuple[list[str], list[str], str]:
    """Sources, references and a description of them, from --src-file and --ref-file."""
    from seq2seq.corpus import read_lines

    sources, references = read_lines(args.src_file), read_lines(args.ref_file)
    if len(sources) != len(references):
        raise UserError(
            f"{args.src_file} has {len(sources)} lines but {args.ref_file} has {len(references)}"
        )
    return sources, references, f"{args.src_file} -> {args.ref_file}"


def read_split(args: argparse.Namespace, cfg: Any) -> tuple[list[str], list[str], str]:
    """Sources, references and a description of them, from --split of the checkpoint's corpus."""
    from seq2seq.corpus import read_pairs, resolve_corpus

    try:
        source = resolve_corpus(cfg.dataset, cfg.data_dir)
        split = pick_split(source, args.split)
        pairs = read_pairs(source, split, cfg.src, cfg.tgt)
    except UserError as err:
        raise UserError(
            f"--split {args.split}: {err} (or give --src-file and --ref-file)"
        ) from None
    return pairs.src, pairs.tgt, f"{source.location} {split} ({cfg.src}-{cfg.tgt})"


def pick_split(source: Any, split: str) -> str:
    """The corpus's own name for `split`; for Multi30k, `test` is test_2016_flickr (as in training)."""
    if split == "test":
        for name in ("test_2016_flickr", "test"):
            if name in source.splits():
                return name
    return source.find_split(split)


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
