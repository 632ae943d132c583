"""Evaluation as a function: translate a split of a checkpoint's corpus (or a source file) and score
it with sacreBLEU (BLEU, chrF), optionally the word alignments too (AER against a gold file).

`evaluate(checkpoint)` (the test split, beam 5) returns an `Evaluation`: the figures and the
hypotheses, nothing written; `EvalOptions` holds how it translates and scores. `seq2seq evaluate`
(seq2seq.commands.evaluate) is its command line: it prints the figures and writes the hypotheses and
the JSON. A bad input is a UserError naming the flag that gave it, before any translation.

Alignments are scored in the reading `AlignmentScoring.reading` names (the model's attention, or its
foresight head: seq2seq.decoding.translator); with `AlignmentScoring.reverse`, a checkpoint of the
other direction, also the reverse direction's links and those of both joined by each of
seq2seq.alignment.words.JOINS, each its own `AlignmentResult` in `Evaluation.readings`.
"""

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import torch

from seq2seq.alignment.words import AERScore, Reading
from seq2seq.decoding.flags import pick_device
from seq2seq.decoding.metrics import Score
from seq2seq.decoding.search_config import SearchConfig
from seq2seq.errors import UserError

if TYPE_CHECKING:
    from seq2seq.decoding.translator import Translator

AlignOn = Literal["ref", "hyp"]
AlignDirection = Literal["tgt2src", "src2tgt", "intersect"]


@dataclass(frozen=True)
class AlignmentScoring:
    """Score the model's word alignments too (`--align-ref`, `--align-on`, `--align-direction`,
    `--align-reading`, `--reverse`)."""

    gold: str  # a gold Pharaoh file, one line per pair (`i-j` sure, `ipj` possible)
    on: AlignOn = "ref"  # ref: the model reads the first reference, teacher-forced; hyp: its output
    direction: AlignDirection = "tgt2src"  # how subword attention becomes word links
    reading: Reading = "attention"  # the model's attention, or its foresight head's
    reverse: str | None = None  # a checkpoint of the other direction: its links, and both joined


@dataclass(frozen=True)
class EvalOptions:
    """How `evaluate` translates and scores. Each field is a flag of `seq2seq evaluate` (the
    alignment ones grouped in `alignment`), so a setting added here is one flag added there."""

    search: SearchConfig = SearchConfig()  # beam size, length penalty, output limits
    device: str = "auto"  # auto: CUDA when there is one
    batch_tokens: int | None = 4096  # source tokens per batch ...
    batch_size: int | None = None  # ... or sentences per batch instead
    lowercase: bool = False  # case-insensitive BLEU
    sacrebleu_tokenize: str = "13a"  # sacreBLEU's BLEU tokenizer (13a: its default)
    alignment: AlignmentScoring | None = None  # None: no alignment scores


@dataclass(frozen=True)
class AlignmentResult:
    """The word alignments' scores against the gold file, and what was aligned."""

    score: AERScore  # AER, precision, recall and the counts behind them
    gold: str  # the gold file
    on: str  # what the model read and how its links were read, in words
    reading: str = "attention"  # attention, foresight, reverse:<reading>, joined:<method>...


@dataclass(frozen=True)
class Evaluation:
    """What `evaluate` measured."""

    checkpoint: str
    data: str  # what was translated: the split of a corpus, or the files
    hypotheses: tuple[str, ...]  # one translation a source sentence, in input order
    bleu: Score  # with its signature, brevity penalty and lengths
    chrf: Score  # with its signature
    seconds: float  # the translation's wall time
    device: str  # the device it ran on
    search: SearchConfig
    alignment: AlignmentResult | None = None  # this checkpoint's reading
    readings: tuple[AlignmentResult, ...] = ()  # every reading scored, `alignment` first

    @property
    def sentences(self) -> int:
        return len(self.hypotheses)

    @property
    def sentences_per_second(self) -> float:
        return self.sentences / max(self.seconds, 1e-9)


def evaluate(
    checkpoint: str | Path,
    split: str = "test",
    *,
    src_file: str | None = None,
    ref_files: list[str] | None = None,
    options: EvalOptions = EvalOptions(),
) -> Evaluation:
    """Translate and score; writes nothing.

    Args:
        checkpoint: a .ckpt written by training (model and tokenizer inside).
        split: any split of the checkpoint's corpus (val, test, ...), read again; unless
            `src_file` and `ref_files` (one file per reference set) give the text instead.
        options: search, batching, device, BLEU's settings and alignment scoring.
    """
    from seq2seq.alignment.words import read_pharaoh
    from seq2seq.checkpoint import corpus_of, read_checkpoint
    from seq2seq.data.words import check_links_fit
    from seq2seq.decoding.metrics import corpus_bleu, corpus_chrf
    from seq2seq.decoding.translator import Translator

    check_scoring(src_file, ref_files, options.sacrebleu_tokenize)
    device = pick_device(options.device)
    files = read_files(src_file, ref_files) if src_file is not None else None  # fail fast
    aligning = options.alignment
    gold = read_pharaoh(aligning.gold) if aligning else None
    corpus = corpus_of(read_checkpoint(checkpoint))
    if aligning is not None and aligning.reverse is not None:
        check_reverse(corpus, aligning.reverse)
    translator = Translator.load(checkpoint, device)
    reverse = None
    if aligning is not None:
        if aligning.reverse is not None:
            reverse = Translator.load(aligning.reverse, device)
        check_heads(aligning.reading, [(checkpoint, translator), (aligning.reverse, reverse)])
    sources, references, data = files or read_split(split, corpus)
    if not sources:
        raise UserError(f"no sentences to evaluate in {data}")
    if gold is not None and len(gold) != len(sources):
        raise UserError(
            f"--align-ref {aligning.gold} has {len(gold)} lines for {len(sources)} pairs"
        )
    if gold is not None:  # own translations: their words are checked once they exist
        links, where = [p for _, p in gold], f"--align-ref {aligning.gold}"
        check_links_fit(links, sources, None if aligning.on == "hyp" else references[0], where)
    batching = (options.batch_tokens, options.batch_size)
    own = aligning is not None and aligning.on == "hyp"
    start = time.perf_counter()
    results = translator.translate(
        sources, options.search, *batching, return_alignments=own,
        direction=aligning.direction if aligning else "tgt2src",
        reading=aligning.reading if own else "attention",
    )  # fmt: skip
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    hypotheses = [result.text for result in results]
    readings: list[AlignmentResult] = []
    if aligning is not None:
        targets = hypotheses if own else references[0]
        if own:
            check_links_fit(links, sources, targets, where)
        else:
            results = translator.align(
                sources, targets, *batching, aligning.direction, reading=aligning.reading
            )
        readings.append(score_alignments(results, gold, aligning))
        if reverse is not None:
            readings += score_joined(results, reverse, targets, sources, gold, aligning, batching)
    return Evaluation(
        checkpoint=str(checkpoint),
        data=data,
        hypotheses=tuple(hypotheses),
        bleu=corpus_bleu(hypotheses, references, options.lowercase, options.sacrebleu_tokenize),
        chrf=corpus_chrf(hypotheses, references),
        seconds=seconds,
        device=str(device),
        search=options.search,
        alignment=readings[0] if readings else None,
        readings=tuple(readings),
    )


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


def read_split(
    split: str, corpus: dict | None, instead: str = " (or give --src-file and --ref-file)"
) -> tuple[list[str], list[list[str]], str]:
    """Sources, the reference set and a description of them, from `split` of the checkpoint's
    corpus; an error ends with `instead`, what the caller may give in its place."""
    from seq2seq.data.corpus import read_pairs, resolve_corpus

    if corpus is None:
        raise UserError(f"the checkpoint names no corpus to read --split {split} from{instead}")
    src, tgt = corpus["src"], corpus["tgt"]
    try:
        source = resolve_corpus(corpus["dataset"], corpus["data_dir"])
        found = source.find_split(split)
        pairs = read_pairs(source, found, src, tgt)
    except UserError as err:
        raise UserError(f"--split {split}: {err}{instead}") from None
    return pairs.src, [pairs.tgt], f"{source.location} {found} ({src}-{tgt})"


def check_reverse(corpus: dict | None, reverse: str) -> None:
    """Refuses a `--reverse` checkpoint that is not one (or that names a corpus the same way round)."""
    from seq2seq.alignment.joined import opposite_error
    from seq2seq.checkpoint import corpus_of, read_checkpoint

    error = opposite_error(corpus, corpus_of(read_checkpoint(reverse)))
    if error:
        raise UserError(f"--reverse {reverse} {error}")


def check_heads(reading: str, readers: list[tuple[str | Path | None, "Translator | None"]]) -> None:
    """Refuses `--align-reading foresight` when one of the (checkpoint, its Translator or None)
    holds no foresight head, naming that checkpoint (with --reverse there are two)."""
    for path, reader in readers:
        if reading == "foresight" and reader is not None and reader.foresight is None:
            raise UserError(
                f"--align-reading foresight: {path} holds no foresight head "
                "(fit one with `seq2seq fit-foresight`)"
            )


def score_alignments(
    results: list, gold: list, scoring: AlignmentScoring, reading: str | None = None
) -> AlignmentResult:
    """AER, precision and recall of the word links of `results` (Translations, one per pair)
    against `gold`, labelled `reading` (default: the results' own)."""
    from seq2seq.alignment.words import alignment_error_rate

    on = "the first reference, teacher-forced" if scoring.on == "ref" else "its translations"
    score = alignment_error_rate([r.word_alignment or [] for r in results], gold)
    reading = reading or (results[0].reading if results else scoring.reading)
    return AlignmentResult(score, scoring.gold, f"{on}, {scoring.direction}", reading)


def score_joined(
    results: list, reverse: "Translator", targets: list[str], sources: list[str], gold: list,
    scoring: AlignmentScoring, batching: tuple[int | None, int | None],
) -> list[AlignmentResult]:  # fmt: skip
    """The reverse translator's reading of each pair turned round (target, source), and the forward
    `results` joined with it by each of JOINS, scored."""
    from seq2seq.alignment.joined import join_all
    from seq2seq.alignment.words import JOINS, flip

    back = reverse.align(targets, sources, *batching, scoring.direction, reading=scoring.reading)
    flipped = [replace(r, word_alignment=flip(r.word_alignment or [])) for r in back]
    scored = [score_alignments(flipped, gold, scoring, f"reverse:{scoring.reading}")]
    for method in JOINS:
        scored.append(
            score_alignments(join_all(results, back, method, scoring.reading), gold, scoring)
        )
    return scored
