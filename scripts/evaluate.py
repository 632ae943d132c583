"""Score a checkpoint with sacreBLEU: `python scripts/evaluate.py CKPT [--split test] [--beam 5]`.

The checkpoint alone is enough with `--src-file S --ref-file R` (`--ref-file` again for more references);
with `--split NAME`, any split of the corpus named in the checkpoint (val, test, test_2017_flickr,
test_2017_mscoco, test_2018_flickr, a newstest, ...) is read again (data/<name>/, ../shared/data/<name>/
or the hub). Prints BLEU (`--sacrebleu-tokenize`, 13a by default) and chrF with their signatures, the
hypotheses' length against the references' with BLEU's brevity penalty (a too short or too long output
shows here, and `--length-penalty` moves it), the number of sentences and sentences/second, and writes
the hypotheses (one per line, in input order) to `--out`, by default next to the checkpoint.

`--align-ref GOLD` also scores the model's word alignments against a gold Pharaoh file (`i-j` sure,
`ipj` possible; words are whitespace tokens from 0), one line per sentence pair: alignment error rate,
precision and recall (Och & Ney 2003). By default the model reads the first reference teacher-forced, as
alignment papers measure it; `--align-on hyp` scores the alignments of its own translations instead,
against a gold (or silver) file made for those translations (scripts/silver_alignments.py on them).
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from sacrebleu.metrics import BLEU

from seq2seq.atomic import atomic_write_text
from seq2seq.cli import cli_message
from seq2seq.decoding.flags import decoding_parser, pick_device, search_config
from seq2seq.errors import UserError


def build_parser() -> argparse.ArgumentParser:
    parser = decoding_parser("Translate a test set with a checkpoint and score it with sacreBLEU.")
    parser.add_argument("checkpoint", metavar="CKPT", help="a .ckpt written by scripts/train.py")
    parser.add_argument(
        "--split", default="test", help="any split of the checkpoint's corpus (val, test, ...)"
    )
    parser.add_argument("--src-file", metavar="S", help="source sentences, one per line")
    parser.add_argument(
        "--ref-file", metavar="R", action="append", help="references, line-aligned with --src-file; "
        "repeat the flag for several references per sentence",
    )  # fmt: skip
    parser.add_argument(
        "--out", metavar="FILE", help="hypotheses file (default: beside the checkpoint)"
    )
    parser.add_argument(
        "--json", metavar="FILE", help="also write the results as JSON ('-': stdout)"
    )
    parser.add_argument("--lowercase", action="store_true", help="case-insensitive BLEU")
    parser.add_argument(
        "--sacrebleu-tokenize", default="13a", choices=list(BLEU.TOKENIZERS),
        help="sacreBLEU's tokenizer for BLEU (zh for Chinese, ja-mecab for Japanese, ...)",
    )  # fmt: skip
    parser.add_argument(
        "--align-ref", metavar="GOLD", help="gold word alignments (Pharaoh, one line per pair): "
        "also print alignment error rate, precision and recall",
    )  # fmt: skip
    parser.add_argument(
        "--align-on", choices=("ref", "hyp"), default="ref", help="ref: the model reads the "
        "first reference (teacher-forced); hyp: its own translations, which GOLD then aligns",
    )  # fmt: skip
    parser.add_argument(
        "--align-direction", choices=("tgt2src", "src2tgt", "intersect"), default="tgt2src",
        help="tgt2src: each target word to its best source word; src2tgt; or both's intersection",
    )  # fmt: skip
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        result = evaluate(args)
    except UserError as err:
        print(f"error: {cli_message(err)}", file=sys.stderr)
        return 2
    report(result, args.json)
    return 0


def evaluate(args: argparse.Namespace) -> dict[str, Any]:
    """Translate, score and write the hypotheses; returns the results as a JSON-ready dict."""
    search = check_flags(args)
    from seq2seq.alignment.words import read_pharaoh
    from seq2seq.checkpoint import corpus_of, read_checkpoint
    from seq2seq.decoding.translator import Translator
    from seq2seq.training.metrics import corpus_bleu, corpus_chrf

    device = pick_device(args.device)
    files = read_files(args) if args.src_file is not None else None  # bad files fail fast
    gold = read_pharaoh(args.align_ref) if args.align_ref else None
    translator = Translator.load(args.checkpoint, device)
    sources, references, data = files or read_split(
        args, corpus_of(read_checkpoint(args.checkpoint))
    )
    if not sources:
        raise UserError(f"no sentences to evaluate in {data}")
    if gold is not None and len(gold) != len(sources):
        raise UserError(
            f"--align-ref {args.align_ref} has {len(gold)} lines for {len(sources)} pairs"
        )
    start = time.perf_counter()
    own = gold is not None and args.align_on == "hyp"
    results = translator.translate(
        sources, search, args.batch_tokens, args.batch_size,
        return_alignments=own, direction=args.align_direction,
    )  # fmt: skip
    hypotheses = [result.text for result in results]
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    out = write_lines(hypotheses, args.out or default_out(args))
    bleu = corpus_bleu(hypotheses, references, args.lowercase, args.sacrebleu_tokenize)
    chrf = corpus_chrf(hypotheses, references)
    result = {
        "checkpoint": str(args.checkpoint),
        "data": data,
        "bleu": bleu.value,
        "bleu_signature": bleu.signature,
        "brevity_penalty": bleu.brevity_penalty,
        "hyp_len": bleu.hyp_len,
        "ref_len": bleu.ref_len,
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
    if gold is not None:
        if not own:
            results = translator.align(
                sources, references[0], args.batch_tokens, args.batch_size, args.align_direction
            )
        result.update(score_alignments(args, [r.word_alignment for r in results], gold))
    if args.json and args.json != "-":
        write_lines([json.dumps(result, indent=2)], args.json, "--json")
    return result


def check_flags(args: argparse.Namespace) -> "SearchConfig":  # noqa: F821
    """The search settings; refuses bad flag combinations and a tokenizer sacreBLEU cannot run."""
    from seq2seq.training.metrics import corpus_bleu

    if (args.src_file is None) != (args.ref_file is None):
        raise UserError("--src-file and --ref-file go together")
    try:
        corpus_bleu(["a"], ["a"], tokenize=args.sacrebleu_tokenize)  # a missing extra fails now
    except (ImportError, RuntimeError, OSError) as err:
        reason = " ".join(str(err).split())
        raise UserError(f"--sacrebleu-tokenize {args.sacrebleu_tokenize}: {reason}") from None
    return search_config(args)


def read_files(args: argparse.Namespace) -> tuple[list[str], list[list[str]], str]:
    """Sources, reference sets and a description of them, from --src-file and --ref-file(s)."""
    from seq2seq.data.corpus import read_lines

    sources = read_lines(args.src_file)
    references = [read_lines(path) for path in args.ref_file]
    for path, lines in zip(args.ref_file, references, strict=True):
        if len(lines) != len(sources):
            raise UserError(f"{args.src_file} has {len(sources)} lines but {path} has {len(lines)}")
    return sources, references, f"{args.src_file} -> {', '.join(args.ref_file)}"


def read_split(
    args: argparse.Namespace, corpus: dict | None
) -> tuple[list[str], list[list[str]], str]:
    """Sources, the reference set and a description of them, from --split of the checkpoint's
    corpus."""
    from seq2seq.data.corpus import read_pairs, resolve_corpus

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
    return pairs.src, [pairs.tgt], f"{source.location} {split} ({src}-{tgt})"


def score_alignments(args: argparse.Namespace, links: list, gold: list) -> dict[str, Any]:
    """AER, precision and recall of the model's `links` (one list per pair) against `gold`."""
    from seq2seq.alignment.words import alignment_error_rate

    score = alignment_error_rate(links, gold)
    on = "the first reference, teacher-forced" if args.align_on == "ref" else "its translations"
    return {
        "aer": score.aer,
        "align_precision": score.precision,
        "align_recall": score.recall,
        "align_links": score.hyp_links,
        "align_ref": args.align_ref,
        "align_on": f"{on}, {args.align_direction}",
    }


def default_out(args: argparse.Namespace) -> Path:
    """`<ckpt stem>.<split or src file>.beam<K>.hyp` beside the checkpoint; ./hyps.txt if that is read-only."""
    data = Path(args.src_file).name if args.src_file else args.split
    path = Path(args.checkpoint).with_name(
        f"{Path(args.checkpoint).stem}.{data}.beam{args.beam}.hyp"
    )
    return path if os.access(path.parent, os.W_OK) else Path("hyps.txt")


def write_lines(lines: list[str], path: str | Path, flag: str = "--out") -> Path:
    """Write `lines` to `path` whole or not at all: a killed evaluation leaves the old file or none."""
    path, text = Path(path), "".join(line + "\n" for line in lines)
    try:
        if path.exists() and not path.is_file():  # /dev/null, /dev/stdout, a pipe: never replaced
            path.write_text(text, encoding="utf-8")
        else:
            atomic_write_text(path, text)
    except OSError as err:
        raise UserError(f"{flag} {path}: cannot write ({err.strerror})") from None
    return path


def report(result: dict[str, Any], json_path: str | None) -> None:
    """Human-readable lines on stdout (BLEU to 2 decimals, as `sacrebleu -b` prints it); JSON if asked."""
    lines = [
        f"data: {result['data']}",
        f"BLEU = {result['bleu']:.2f}  {result['bleu_signature']}",
        f"length: hypotheses {result['hyp_len'] / max(result['ref_len'], 1):.3f} of the references "
        f"({result['hyp_len']:,} / {result['ref_len']:,} tokens), brevity penalty "
        f"{result['brevity_penalty']:.3f}",
        f"chrF = {result['chrf']:.2f}  {result['chrf_signature']}",
        f"sentences: {result['sentences']}  {result['sentences_per_second']:.1f} sentences/s "
        f"({result['seconds']:.2f} s, beam {result['beam']}, {result['device']})",
        f"hypotheses: {result['hypotheses']}",
    ]
    if "aer" in result:
        lines.append(
            f"AER = {result['aer']:.4f}  precision = {result['align_precision']:.4f}  recall = "
            f"{result['align_recall']:.4f}  ({result['align_on']}; {result['align_ref']})"
        )
    if json_path == "-":  # stdout is the JSON alone, so it pipes into jq
        print(json.dumps(result, indent=2))
        print("\n".join(lines), file=sys.stderr)
    else:
        print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
