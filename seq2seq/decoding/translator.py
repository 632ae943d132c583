"""Translator: a trained model and its tokenizer, translating lists of sentences.

    from seq2seq import Translator
    translator = Translator.load("best.ckpt", device="cpu")
    [result] = translator.translate(["Ein Hund läuft ."], beam=5, return_alignments=True)
    result.text, result.score, result.word_alignment    # "A dog runs .", -1.9, [(0, 0), (1, 1), ...]
    [forced] = translator.align(["Ein Hund läuft ."], ["A dog is running ."])

**Attention** (`Translation.attention`): what the search used for each output subword (rows) over
the source subwords (columns), both ending in `</s>`; under beam search, the chosen hypothesis's
own. The Transformer gives the cross-attention of its alignment layer (default: the last decoder
layer), one map per head (T, N, S); all word-level values use the model's `alignment_view` of them:
the mean over heads, or the one head its guided-alignment training chose (`alignment_heads`).
**Words** are the whitespace-separated tokens of the raw sentence (`text.split()`), numbered from 0
as in Pharaoh files. A subword belongs to the word whose characters it covers (sentencepiece's
offsets into the raw text: normalisation never shifts a word). A source word's columns add up and a
target word's rows are averaged (alignment.merge_to_words). **EOS is dropped**, not spread: a row of
`word_attention` sums to 1 minus the mass its subwords put on `</s>` (fairseq #4446), and the `</s>`
row aligns nothing. `word_alignment` links each target word to its highest-weighted source word
(`direction="tgt2src"`; also "src2tgt" and "intersect").

**Readings.** Alignments are read from the model's own attention (`reading="attention"`, the
default), or from a foresight head (`reading="foresight"`): an attention whose query has read the
target piece it aligns, fitted beside the frozen model by `seq2seq fit-foresight` and kept in a copy
of its checkpoint (seq2seq.models.foresight, seq2seq.alignment.foresight). With it, `attention` and
the word values are the head's, read teacher-forced on the pair (`align`) or on the chosen
translation (`translate`); the search itself is unchanged. Every result names its reading
(`Translation.reading`, also in `to_dict`); the links of a de->en and an en->de translator joined are
seq2seq.alignment.joined's ("joined:grow-diag-final-and", ...).

**Length.** The Transformer's position table bounds every length (`positions.max_len`): a longer source
(or `align` target) is cut to fit, with a `TruncatedInput` warning naming the sentence, and no output
grows past it. The GRU has no limit. The scripts (evaluate.py, translate.py) are thin wrappers.
"""

import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor

from seq2seq.alignment.foresight import head_of
from seq2seq.alignment.stats import means, recorded_scores, row_sums, stacked_scores
from seq2seq.alignment.words import READINGS, Reading, word_alignment
from seq2seq.checkpoint import corpus_of, read_checkpoint
from seq2seq.data.batching import TokenBudgetBatchSampler, collate
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.data.words import Link
from seq2seq.decoding.loading import load_model
from seq2seq.decoding.search import Hypotheses, SearchConfig, translate_batch
from seq2seq.errors import UserError
from seq2seq.models.foresight import ForesightHead, foresight_weights, translator_states
from seq2seq.models.interface import Seq2Seq

Direction = Literal["tgt2src", "src2tgt", "intersect"]
Span = tuple[int, int]  # (start, end) characters of a subword in its sentence
Source = tuple[str, list[Span], list[int]]  # a sentence, its subwords' spans and their ids


@dataclass
class Translation:
    """One hypothesis of one source sentence (or, from `align`, the given target), as plain values.

    text: the detokenized translation. score: its total log-probability (EOS included).
    src_tokens, tgt_tokens: the subwords of source and hypothesis, each ending in `</s>`.
    attention: (len(tgt_tokens), [N,] len(src_tokens)) soft attention, rows = output subwords.
    nbest: the n best hypotheses (best first, this one first) when more than one was asked for.
    src_words, tgt_words: `source.split()` and `text.split()`.
    word_attention: (len(tgt_words), len(src_words)), heads reduced as `alignment_head` says, EOS
        dropped (module docstring); None unless alignments were asked for.
    word_alignment: (source word, target word) index pairs, sorted; None unless asked for.
    reading: what `attention` and the word values were read from: "attention" (the model's),
        "foresight" (its foresight head's), or "joined:<method>" (word_alignment: the links of two
        directions joined, seq2seq.alignment.joined; the matrices stay this direction's).
    """

    text: str
    score: float
    src_tokens: list[str]
    tgt_tokens: list[str]
    attention: Tensor
    nbest: list["Translation"] = field(default_factory=list)
    src_words: list[str] = field(default_factory=list)
    tgt_words: list[str] = field(default_factory=list)
    word_attention: Tensor | None = None
    word_alignment: list[Link] | None = None
    alignment_head: int | None = None  # the head alignments read (None: the mean of the heads)
    reading: str = "attention"

    def to_dict(self, digits: int | None = None) -> dict[str, Any]:
        """JSON-ready values: matrices as nested lists (`attention` averaged over heads, or the
        model's `alignment_head`; rounded to `digits` when given), links as [source, target]
        pairs, the n-best list as dicts."""

        def rows(matrix: Tensor) -> list[list[float]]:
            values = matrix.tolist()
            return values if digits is None else [[round(v, digits) for v in r] for r in values]

        mean = self.attention  # (T, S), or (T, N, S) reduced to (T, S) here
        if mean.dim() == 3:
            head = self.alignment_head
            mean = mean.mean(1) if head is None else mean[:, head]  # (T, S)
        out = {"text": self.text, "score": self.score, "reading": self.reading}
        out["src_tokens"] = self.src_tokens
        out.update(tgt_tokens=self.tgt_tokens, attention=rows(mean))
        out.update(src_words=self.src_words, tgt_words=self.tgt_words)
        if self.word_attention is not None:
            out["word_attention"] = rows(self.word_attention)
            out["word_alignment"] = [list(link) for link in self.word_alignment or []]
        if self.nbest:
            out["nbest"] = [hyp.to_dict(digits) for hyp in self.nbest]
        return out


class TruncatedInput(UserWarning):
    """A sentence longer than the model reads was cut; `index` is its place (from 0) in the input."""

    def __init__(self, index: int, detail: str) -> None:
        super().__init__(f"sentence {index + 1}: {detail}")
        self.index, self.detail = index, detail


def sentence_list(name: str, value: Any) -> list[str]:
    """`value`, a list of sentences; one str, which would be read as a list of characters, is refused."""
    if isinstance(value, str):
        raise TypeError(
            f"`{name}` is a list of sentences: give [{value[:40]!r}], not the str alone"
        )
    return list(value)


class Translator:
    """Translate with `model` and `tokenizer` on `device` (the model is moved there, in eval mode);
    `foresight`: the model's foresight head, which the "foresight" reading needs; `corpus`: what the
    model was trained on (`seq2seq.checkpoint.corpus_of`: src, tgt, ...), None if unknown."""

    def __init__(
        self,
        model: Seq2Seq,
        tokenizer: Tokenizer,
        device: str | torch.device = "cpu",
        foresight: ForesightHead | None = None,
        corpus: dict[str, Any] | None = None,
    ):
        self.device = torch.device(device)
        self.model, self.tokenizer = model.to(self.device).eval(), tokenizer
        self.foresight = None if foresight is None else foresight.to(self.device).eval()
        self.corpus = corpus

    @classmethod
    def load(cls, path: str | Path, device: str | torch.device = "cpu") -> "Translator":
        """A Translator for the checkpoint at `path` (the file alone is enough), with the foresight
        head the checkpoint holds, if any."""
        model, tokenizer = load_model(path)
        checkpoint = read_checkpoint(path)
        return cls(model, tokenizer, device, head_of(checkpoint), corpus_of(checkpoint))

    def translate(
        self,
        sentences: list[str],
        search: SearchConfig | None = None,
        batch_tokens: int = 4096,
        batch_size: int | None = None,
        return_alignments: bool = False,
        direction: Direction = "tgt2src",
        check: Callable[[], None] | None = None,
        reading: Reading = "attention",
        **settings: float,
    ) -> list[Translation]:
        """Translate `sentences` (raw text); one result per sentence, in order. A blank sentence gets
        an empty translation with score 0.

        `settings` override fields of `search` (default: SearchConfig()) by name (`beam=5`,
        `nbest=3`, `length_penalty=0.6`). Batches hold `batch_tokens` source tokens, or
        `batch_size` sentences when that is given. `return_alignments` adds `word_attention` and
        `word_alignment` (links in `direction`) to every result, n-best ones included, read as
        `reading` says (the module docstring). `check` is called before every search step; what it
        raises ends the call (a server's deadline).
        """
        self._check_reading(reading, return_alignments)
        sentences = sentence_list("sentences", sentences)
        search = replace(search or SearchConfig(), **settings)
        encoded = [self.tokenizer.encode_with_spans(line) for line in sentences]
        kept = [i for i, line in enumerate(sentences) if line.strip()]
        src_ids = self._fit([encoded[i][0] for i in kept], kept, "source")
        found = self.search(src_ids, search, batch_tokens, batch_size, check)
        if reading != "attention":  # each hypothesis read again, teacher-forced
            found = self._read_hypotheses(src_ids, found, reading, batch_tokens, batch_size, check)
        words = direction if return_alignments else None
        results: dict[int, Translation] = {}
        for j, i in enumerate(kept):
            src, hyps = (sentences[i], encoded[i][1], src_ids[j]), found[j]
            options = [
                self._result(src, ids, float(score), weights, words, reading=reading)
                for ids, score, weights in zip(hyps.tokens, hyps.scores, hyps.weights, strict=True)
            ]
            results[i] = replace(options[0], nbest=options if search.nbest > 1 else [])
        blank = ("", [], [])  # no words, no subwords: only EOS, attending to nothing
        return [
            results.get(i)
            or self._result(blank, [], 0.0, torch.zeros(1, 1), words, reading=reading)
            for i in range(len(sentences))
        ]

    def align(
        self,
        sources: list[str],
        targets: list[str],
        batch_tokens: int = 4096,
        batch_size: int | None = None,
        direction: Direction = "tgt2src",
        check: Callable[[], None] | None = None,
        reading: Reading = "attention",
    ) -> list[Translation]:
        """Teacher-forced alignments: the model reads `targets[i]` as its translation of
        `sources[i]` (what alignment papers measure). Each result has `text` = the target, `score` =
        log p(target | source) with EOS, the attention of `reading` (the module docstring), and the
        word alignments. `check` is called before each batch is read; what it raises ends the call."""
        self._check_reading(reading)
        sources, targets = sentence_list("sources", sources), sentence_list("targets", targets)
        if len(sources) != len(targets):
            raise ValueError(f"{len(sources)} sources but {len(targets)} targets")
        src, tgt = ([self.tokenizer.encode_with_spans(x) for x in xs] for xs in (sources, targets))
        src_ids = self._fit([ids for ids, _ in src], range(len(src)), "source")
        tgt_ids = self._fit([ids for ids, _ in tgt], range(len(tgt)), "target")
        pairs = enumerate(zip(src_ids, tgt_ids, strict=True))
        items = [{"src_ids": s, "tgt_ids": t, "index": i} for i, (s, t) in pairs]
        results: list[Translation] = [None] * len(items)  # type: ignore[list-item]
        for batch in self._batches(items, batch_tokens, batch_size):
            if check is not None:
                check()
            weights, scores = self._forced(batch, reading)  # (B, T, [N,] S), (B,)
            for b, i in enumerate(batch["index"].tolist()):
                rows, cols = len(tgt_ids[i]) + 1, len(src_ids[i]) + 1  # with EOS
                results[i] = self._result(
                    (sources[i], src[i][1], src_ids[i]), tgt_ids[i], scores[b],
                    weights[b, :rows, ..., :cols], direction, (targets[i], tgt[i][1]), reading,
                )  # fmt: skip
        return results

    @torch.no_grad()
    def attention_statistics(
        self, sources: list[str], targets: list[str], batch_tokens: int = 4096
    ) -> dict[str, float | None]:
        """How sharp the attention is while the model reads `targets` teacher-forced: the means per
        target row of seq2seq.alignment.stats (`attn_entropy`, `max_weight`, `score_std`)."""
        if len(sources) != len(targets):
            raise ValueError(f"{len(sources)} sources but {len(targets)} targets")
        src_ids = self._fit(
            [self.tokenizer.encode(x) for x in sources], range(len(sources)), "source"
        )
        tgt_ids = self._fit(
            [self.tokenizer.encode(x) for x in targets], range(len(targets)), "target"
        )
        pairs = enumerate(zip(src_ids, tgt_ids, strict=True))
        items = [{"src_ids": s, "tgt_ids": t, "index": i} for i, (s, t) in pairs]
        sums, scored = torch.zeros(4, dtype=torch.float64), True
        for batch in self._batches(items, batch_tokens, None):
            batch = {name: value.to(self.device) for name, value in batch.items()}
            with recorded_scores(self.model) as recorded:
                state = self.model.encode(batch["src"], batch["src_lens"], batch["src_mask"])
                _, weights = self.model.decode(state, batch["tgt_in"])  # (B, T, [N,] S)
            scores = stacked_scores(recorded, batch["tgt_in"].size(1))  # (B, T, S) or None
            scored = scored and scores is not None
            sums += row_sums(weights, batch["tgt_mask"], batch["src_mask"], scores)
        return means(sums, with_scores=scored)

    def search(
        self,
        src_ids: list[list[int]],
        search: SearchConfig,
        batch_tokens: int = 4096,
        batch_size: int | None = None,
        check: Callable[[], None] | None = None,
    ) -> list[Hypotheses]:
        """Search for each source (ids without EOS, at most `max_len` - 1 of them): per sentence, its
        `search.nbest` best hypotheses (fewer if the beam found fewer), best first, on the CPU."""
        found: list[Hypotheses] = [None] * len(src_ids)  # type: ignore[list-item]
        items = [{"src_ids": ids, "index": i} for i, ids in enumerate(src_ids)]
        for batch in self._batches(items, batch_tokens, batch_size):
            hyps = translate_batch(self.model, batch, search, check)
            for b, i in enumerate(batch["index"].tolist()):
                one = Hypotheses([hyps.tokens[b]], hyps.scores[b : b + 1].cpu(), [hyps.weights[b]])
                found[i] = hyps.nbest[b] if hyps.nbest is not None else one  # greedy: no list
        return found

    def _check_reading(self, reading: str, alignments: bool = True) -> None:
        """Refuses a reading this Translator cannot give, or one with no alignments to read."""
        if reading not in READINGS:
            raise ValueError(f"reading must be one of {', '.join(READINGS)}, got {reading!r}")
        if reading != "attention" and not alignments:
            raise ValueError(f"reading={reading!r} reads alignments: pass return_alignments=True")
        if reading == "foresight" and self.foresight is None:
            raise UserError(
                "the checkpoint holds no foresight head: fit one with `seq2seq fit-foresight CKPT`"
            )

    def _read_hypotheses(
        self,
        src_ids: list[list[int]],
        found: list[Hypotheses],
        reading: Reading,
        batch_tokens: int,
        batch_size: int | None,
        check: Callable[[], None] | None,
    ) -> list[Hypotheses]:
        """`found` with each hypothesis's weights read again as `reading`, teacher-forced on it;
        `check` is called before each batch."""
        pairs = [(src_ids[i], list(ids)) for i, hyps in enumerate(found) for ids in hyps.tokens]
        items = [{"src_ids": s, "tgt_ids": t, "index": k} for k, (s, t) in enumerate(pairs)]
        read: list[Tensor] = [None] * len(items)  # type: ignore[list-item]
        for batch in self._batches(items, batch_tokens, batch_size):
            if check is not None:
                check()
            weights, _ = self._forced(batch, reading)  # (B, T, S)
            for b, k in enumerate(batch["index"].tolist()):
                rows, cols = len(items[k]["tgt_ids"]) + 1, len(items[k]["src_ids"]) + 1
                read[k] = weights[b, :rows, :cols]
        out, k = [], 0
        for hyps in found:
            n = len(hyps.tokens)
            out.append(replace(hyps, weights=read[k : k + n]))
            k += n
        return out

    def _fit(self, id_lists: list[list[int]], places: Sequence[int], side: str) -> list[list[int]]:
        """Cut what the model cannot read (EOS or BOS still to come) to its length, with a warning
        per sentence that names its place in the caller's list."""
        if self.model.max_len is None:  # the GRU: no limit; a Transformer: its positions
            return id_lists
        limit = self.model.max_len - 1
        for ids, place in zip(id_lists, places, strict=True):
            if len(ids) > limit:
                detail = f"the {side} has {len(ids)} subwords and the model reads {limit}: cut"
                warnings.warn(TruncatedInput(place, detail), stacklevel=3)
        return [ids[:limit] for ids in id_lists]

    def _batches(
        self, items: list[dict[str, Any]], batch_tokens: int, batch_size: int | None
    ) -> Iterator[dict[str, Tensor]]:
        """Length-sorted batches of `items` (`src_ids`, `index`, maybe `tgt_ids`), as `collate`s."""
        lengths = [max(len(x["src_ids"]), len(x.get("tgt_ids", ()))) + 1 for x in items]
        if batch_size is None:
            groups = TokenBudgetBatchSampler(lengths, batch_tokens)
        else:
            ranked = sorted(range(len(items)), key=lengths.__getitem__)  # similar lengths pad least
            groups = [ranked[k : k + batch_size] for k in range(0, len(ranked), batch_size)]
        for rows in groups:
            yield collate([items[r] for r in rows])

    @torch.no_grad()
    def _forced(
        self, batch: dict[str, Tensor], reading: Reading = "attention"
    ) -> tuple[Tensor, list[float]]:
        """Teacher-forced weights of `reading` (B, T, [N,] S) on the CPU and log p(target | source)
        per pair."""
        batch = {name: value.to(self.device) for name, value in batch.items()}
        state = self.model.encode(batch["src"], batch["src_lens"], batch["src_mask"])
        features, weights = self.model.decode(state, batch["tgt_in"])  # (B, T, O), (B, T, [N,] S)
        if (
            reading == "foresight"
        ):  # the head's weights instead (B, T, S); the score stays the model's
            weights, _ = foresight_weights(self.foresight, translator_states(self.model, batch))
        mask = batch["tgt_mask"]  # (B, T)
        log_probs = self.model.generator(features[mask]).float().log_softmax(-1)  # (M, V) real
        token = log_probs.gather(1, batch["tgt_out"][mask].unsqueeze(1)).squeeze(1)  # (M,)
        pair = torch.arange(mask.size(0), device=mask.device)[:, None].expand_as(mask)[mask]  # (M,)
        scores = token.new_zeros(mask.size(0)).index_add_(0, pair, token)  # (B,)
        return weights.float().cpu(), scores.tolist()

    def _result(
        self, src: Source, ids: list[int], score: float, weights: Tensor,
        direction: Direction | None, tgt: tuple[str, list[Span]] | None = None,
        reading: Reading = "attention",
    ) -> Translation:  # fmt: skip
        """The Translation of source (text, spans, ids) as target `ids`, whose (text, spans) are
        `tgt` when given (`align`), else decoded; with word alignments unless `direction` is None;
        `weights` are those of `reading`."""
        text, tgt_spans = tgt if tgt is not None else self.tokenizer.decode_with_spans(ids)
        result = Translation(
            text=text,
            score=score,
            src_tokens=[*self.tokenizer.pieces(src[2]), "</s>"],
            tgt_tokens=[*self.tokenizer.pieces(ids), "</s>"],
            attention=weights,
            src_words=src[0].split(),
            tgt_words=text.split(),
            alignment_head=self.model.alignment_head,
            reading=reading,
        )
        if direction is not None:
            # (T, S): the head(s) training chose; a blank sentence's (1, 1) zeros have no heads
            aligned = self.model.alignment_view(weights) if weights.dim() == 3 else weights
            result.word_attention, result.word_alignment = word_alignment(
                aligned, src[0], src[1][: len(src[2])], text, tgt_spans[: len(ids)], direction
            )
        return result
