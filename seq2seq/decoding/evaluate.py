"""Evaluation as a function: translate a split of a checkpoint's corpus (or a source file) and score
it with sacreBLEU (BLEU, chrF), optionally the word alignments too (AER against a gold file).

`evaluate(checkpoint, split="test", search=SearchConfig(beam=5))` returns the results as a JSON-ready
dict and writes the hypotheses to a file; `seq2seq evaluate` (seq2seq.commands.evaluate) is its
command line and prints them. A bad input is a UserError naming the flag that gave it.
"""

import json
import os
import time
from pathlib import Path
from typing import Any, Literal

import torch

from seq2seq.atomic import atomic_write_text
from seq2seq.decoding.flags import pick_device
from seq2seq.decoding.search_config import SearchConfig
from seq2seq.errors import UserError

AlignOn = Literal["ref", "hyp"]
AlignDirection = Literal["tgt2src", "src2tgt", "intersect"]


def evaluate(
    checkpoint: str | Path,
    split: str = "test",
    *,
    search: SearchConfig = SearchConfig(),
    src_file: str | None = None,
    ref_files: list[str] | None = None,
    out: str | Path | None = None,
    json_path: str | None = None,
    device: str = "auto",
    batch_tokens: int | None = 4096,
    batch_size: int | None = None,
    lowercase: bool = False,
    sacrebleu_tokenize: str = "13a",
    align_ref: str | None = None,
    align_on: AlignOn = "ref",
    align_direction: AlignDirection = "tgt2src",
) -> dict[str, Any]:
    """Translate, score and write the hypotheses; returns the results as a JSON-ready dict.

    Args:
        checkpoint: a .ckpt written by training (model and tokenizer inside).
        split: any split of the checkpoint's corpus (val, test, ...), read again; unless
            `src_file` and `ref_files` (one file per reference set) give the text instead.
        search: beam size, length penalty, output limits.
        out: the hypotheses file (default: beside the checkpoint, `<stem>.<data>.beam<K>.hyp`).
        json_path: also write the results there as JSON ('-': the caller prints them).
        batch_tokens, batch_size: source tokens per batch, or sentences per batch instead.
        lowercase, sacrebleu_tokenize: sacreBLEU's BLEU settings (13a: its default tokenizer).
        align_ref: a gold Pharaoh file, one line per pair: AER, precision and recall too, of the
            model reading the first reference (`align_on="ref"`) or its own output ("hyp").
    """
    check_scoring(src_file, ref_files, sacrebleu_tokenize)
    from seq2seq.alignment.words import read_pharaoh
    from seq2seq.checkpoint import corpus_of, read_checkpoint
    from seq2seq.decoding.metrics import corpus_bleu, corpus_chrf
    from seq2seq.decoding.translator import Translator

    torch_device = pick_device(device)
    files = read_files(src_file, ref_files) if src_file is not None else None  # fail fast
    gold = read_pharaoh(align_ref) if align_ref else None
    translator = Translator.load(checkpoint, torch_device)
    sources, references, data = files or read_split(split, corpus_of(read_checkpoint(checkpoint)))
    if not sources:
        raise UserError(f"no sentences to evaluate in {data}")
    if gold is not None and len(gold) != len(sources):
        raise UserError(f"--align-ref {align_ref} has {len(gold)} lines for {len(sources)} pairs")
    start = time.perf_counter()
    own = gold is not None and align_on == "hyp"
    results = translator.translate(
        sources, search, batch_tokens, batch_size,
        return_alignments=own, direction=align_direction,
    )  # fmt: skip
    hypotheses = [result.text for result in results]
    if torch_device.type == "cuda":
        torch.cuda.synchronize(torch_device)
    seconds = time.perf_counter() - start
    written = write_lines(
        hypotheses, out or default_out(checkpoint, src_file or split, search.beam)
    )
    bleu = corpus_bleu(hypotheses, references, lowercase, sacrebleu_tokenize)
    chrf = corpus_chrf(hypotheses, references)
    result = {
        "checkpoint": str(checkpoint),
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
        "beam": search.beam,
        "length_penalty": search.length_penalty,
        "device": str(torch_device),
        "hypotheses": str(written),
    }
    if gold is not None:
        if not own:
            results = translator.align(
                sources, references[0], batch_tokens, batch_size, align_direction
            )
        links = [r.word_alignment for r in results]
        result.update(score_alignments(links, gold, align_ref, align_on, align_direction))
    if json_path and json_path != "-":
        write_lines([json.dumps(result, indent=2)], json_path, "--json")
    return result


def check_scoring(src_file: str | None, ref_files: list[str] | None, tokenize: str) -> None:
    """Refuses files given by halves and a tokenizer sacreBLEU cannot run."""
    from seq2seq.decoding.metrics import corpus_bleu

    if (src_file is None) != (ref_files is None):
        raise UserError("--src-file and --ref-file go together")
    try:
        corpus_bleu(["a"], ["a"], tokenize=tokenize)  # a missing extra fails now
    except (ImportError, RuntimeError, OSError) as err:
        reason = " ".join(str(err).split())
        raise UserError(f"--sacrebleu-tokenize {tokenize}: {reason}") from None


def read_files(src_file: str, ref_files: list[str]) -> tuple[list[str], list[list[str]], str]:
    """Sources, reference sets and a description of them, from --src-file and --ref-file(s)."""
    from seq2seq.data.corpus import read_lines

    sources = read_lines(src_file)
    references = [read_lines(path) for path in ref_files]
    for path, lines in zip(ref_files, references, strict=True):
        if len(lines) != len(sources):
            raise UserError(f"{src_file} has {len(sources)} lines but {path} has {len(lines)}")
    return sources, references, f"{src_file} -> {', '.join(ref_files)}"


def read_split(split: str, corpus: dict | None) -> tuple[list[str], list[list[str]], str]:
    """Sources, the reference set and a description of them, from `split` of the checkpoint's
    corpus."""
    from seq2seq.data.corpus import read_pairs, resolve_corpus

    if corpus is None:
        raise UserError("the checkpoint names no corpus: give --src-file and --ref-file")
    src, tgt = corpus["src"], corpus["tgt"]
    try:
        source = resolve_corpus(corpus["dataset"], corpus["data_dir"])
        found = source.find_split(split)
        pairs = read_pairs(source, found, src, tgt)
    except UserError as err:
        raise UserError(f"--split {split}: {err} (or give --src-file and --ref-file)") from None
    return pairs.src, [pairs.tgt], f"{source.location} {found} ({src}-{tgt})"


def score_alignments(
    links: list, gold: list, align_ref: str, align_on: AlignOn, direction: AlignDirection
) -> dict[str, Any]:
    """AER, precision and recall of the model's `links` (one list per pair) against `gold`."""
    from seq2seq.alignment.words import alignment_error_rate

    score = alignment_error_rate(links, gold)
    on = "the first reference, teacher-forced" if align_on == "ref" else "its translations"
    return {
        "aer": score.aer,
        "align_precision": score.precision,
        "align_recall": score.recall,
        "align_links": score.hyp_links,
        "align_ref": align_ref,
        "align_on": f"{on}, {direction}",
    }


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
