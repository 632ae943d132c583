"""Score a checkpoint with sacreBLEU: `seq2seq evaluate CKPT [--split test] [--beam 5]` (or
`python scripts/evaluate.py ...`); the procedure is seq2seq.decoding.evaluate.evaluate.

The checkpoint alone is enough with `--src-file S --ref-file R` (`--ref-file` again for more references);
with `--split NAME`, any split of the corpus named in the checkpoint (val, test, test_2017_flickr,
test_2017_mscoco, test_2018_flickr, a newstest, ...) is read again (found as seq2seq.data.corpus
says: under $SEQ2SEQ_DATA, data/<name>/, ../shared/data/<name>/ or the hub). Prints BLEU (`--sacrebleu-tokenize`, 13a by default) and chrF with their signatures, the
hypotheses' length against the references' with BLEU's brevity penalty (a too short or too long output
shows here, and `--length-penalty` moves it), the number of sentences and sentences/second, and writes
the hypotheses (one per line, in input order) to `--out`, by default next to the checkpoint.

`--align-ref GOLD` also scores the model's word alignments against a gold Pharaoh file (`i-j` sure,
`ipj` possible; words are whitespace tokens from 0), one line per sentence pair: alignment error rate,
precision and recall (Och & Ney 2003). By default the model reads the first reference teacher-forced, as
alignment papers measure it; `--align-on hyp` scores the alignments of its own translations instead,
against a gold (or silver) file made for those translations (`seq2seq silver-alignments` on them).
`--align-reading foresight` reads the links from the checkpoint's foresight head (`seq2seq
fit-foresight`) instead of its attention. `--reverse CKPT2`, a checkpoint of the other direction, also
scores its links (each pair read turned round) and both directions' joined by intersection, union,
grow-diag-final and grow-diag-final-and: one AER line each, named by its reading.

The procedure returns the figures; this command writes the files, each whole or not at all: the
hypotheses (`--out`) and, with `--json FILE`, the figures as JSON (the keys `result_json` lists; the
study's scoring reads them).
"""

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from sacrebleu.metrics import BLEU

from seq2seq.atomic import atomic_write_text, check_writable_file
from seq2seq.cli import cli_message
from seq2seq.decoding.evaluate import AlignmentScoring, EvalOptions, Evaluation, evaluate
from seq2seq.decoding.flags import add_reading_flags, decoding_parser, refuse_unread, search_config
from seq2seq.errors import UserError


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    parser = decoding_parser(
        "Translate a test set with a checkpoint and score it with sacreBLEU.", prog
    )
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
    add_reading_flags(
        parser, "a checkpoint of the other direction (en->de for de->en): also score its links and "
        "both directions' joined",
    )  # fmt: skip
    return parser


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    try:
        if not args.align_ref:  # each of these is read by the alignment scoring alone
            flags = ("reverse", "align_reading", "align_on", "align_direction")
            refuse_unread(
                parser, args, flags, "is for alignment scoring: give --align-ref GOLD too"
            )
        if args.src_file:
            refuse_unread(parser, args, ["split"], "names a corpus split: --src-file's are read")
        # the n-best lists are translate's: BLEU and the hypotheses file read the best alone
        refuse_unread(
            parser, args, ["nbest"], "is translate's: evaluate scores the best hypothesis"
        )
        options = eval_options(args)
        data = args.src_file or args.split
        out = Path(args.out or default_out(args.checkpoint, data, options.search.beam))
        inputs = (
            args.checkpoint,
            args.src_file,
            *(args.ref_file or []),
            args.align_ref,
            args.reverse,
        )
        check_writable_file(out, f"--out {out}", inputs)  # before the translation, not after it
        if args.json and args.json != "-":
            check_writable_file(args.json, f"--json {args.json}", inputs)
        found = evaluate(
            args.checkpoint, args.split, src_file=args.src_file, ref_files=args.ref_file,
            options=options,
        )  # fmt: skip
        written = write_lines(list(found.hypotheses), out)
        result = result_json(found, written)
        if args.json and args.json != "-":
            write_lines([json.dumps(result, indent=2)], args.json, "--json")
    except UserError as err:
        print(f"error: {cli_message(err)}", file=sys.stderr)
        return 2
    report(result, args.json)
    return 0


def eval_options(args: argparse.Namespace) -> EvalOptions:
    """The flags as `EvalOptions`; a bad value is a UserError naming its flag."""
    alignment = None
    if args.align_ref:
        alignment = AlignmentScoring(
            args.align_ref, args.align_on, args.align_direction, args.align_reading, args.reverse
        )
    return EvalOptions(
        search=search_config(args),
        device=args.device,
        batch_tokens=args.batch_tokens,
        batch_size=args.batch_size,
        lowercase=args.lowercase,
        sacrebleu_tokenize=args.sacrebleu_tokenize,
        alignment=alignment,
    )


def result_json(found: Evaluation, hypotheses: Path) -> dict[str, Any]:
    """The figures as `--json` writes them (`hypotheses`: the file they were written to). Studies
    read these keys (seq2seq.study.scoring): keep them."""
    result = {
        "checkpoint": found.checkpoint,
        "data": found.data,
        "bleu": found.bleu.value,
        "bleu_signature": found.bleu.signature,
        "brevity_penalty": found.bleu.brevity_penalty,
        "hyp_len": found.bleu.hyp_len,
        "ref_len": found.bleu.ref_len,
        "chrf": found.chrf.value,
        "chrf_signature": found.chrf.signature,
        "sentences": found.sentences,
        "seconds": found.seconds,
        "sentences_per_second": found.sentences_per_second,
        "beam": found.search.beam,
        "length_penalty": found.search.length_penalty,
        "device": found.device,
        "hypotheses": str(hypotheses),
    }
    if found.alignment is not None:
        score = found.alignment.score
        result |= {
            "aer": score.aer,
            "align_precision": score.precision,
            "align_recall": score.recall,
            "align_links": score.hyp_links,
            "align_ref": found.alignment.gold,
            "align_on": found.alignment.on,
            "align_reading": found.alignment.reading,
        }
    if len(found.readings) > 1:  # with --reverse: every reading, this checkpoint's first
        result["alignments"] = [
            {"reading": r.reading, "aer": r.score.aer, "precision": r.score.precision,
             "recall": r.score.recall, "links": r.score.hyp_links}
            for r in found.readings
        ]  # fmt: skip
    return result


def default_out(checkpoint: str | Path, data: str, beam: int) -> Path:
    """`<ckpt stem>.<split or src file>.beam<K>.hyp` beside the checkpoint; ./hyps.txt if that is
    read-only."""
    path = Path(checkpoint).with_name(f"{Path(checkpoint).stem}.{Path(data).name}.beam{beam}.hyp")
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
    readings = result.get("alignments") or []
    if "aer" in result and not readings:
        readings = [{"reading": result["align_reading"], "aer": result["aer"],
                     "precision": result["align_precision"], "recall": result["align_recall"]}]  # fmt: skip
    for r in readings:  # one line a reading, named first in the brackets
        lines.append(
            f"AER = {r['aer']:.4f}  precision = {r['precision']:.4f}  recall = {r['recall']:.4f}  "
            f"({r['reading']}; {result['align_on']}; {result['align_ref']})"
        )
    if json_path == "-":  # stdout is the JSON alone, so it pipes into jq
        print(json.dumps(result, indent=2))
        print("\n".join(lines), file=sys.stderr)
    else:
        print("\n".join(lines))
