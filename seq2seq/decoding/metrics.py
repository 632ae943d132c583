"""Corpus metrics: sacreBLEU BLEU and chrF with their signatures, and perplexity."""

import math
from collections.abc import Sequence
from dataclasses import dataclass

from sacrebleu.metrics import BLEU, CHRF


@dataclass
class Score:
    """One corpus-level score and the sacreBLEU signature that makes it reproducible; for BLEU also
    the lengths behind its brevity penalty (tokens as BLEU's tokenizer counts them)."""

    value: float
    signature: str
    brevity_penalty: float | None = None
    hyp_len: int | None = None  # hypotheses' tokens
    ref_len: int | None = None  # references' tokens (the closest reference's, with several)


def _streams(references: Sequence[str] | Sequence[Sequence[str]]) -> list[Sequence[str]]:
    """One reference per hypothesis (a list of str), or several: one such list per reference set."""
    return [references] if not references or isinstance(references[0], str) else list(references)


def corpus_bleu(
    hypotheses: list[str],
    references: Sequence[str] | Sequence[Sequence[str]],
    lowercase: bool = False,
    tokenize: str = "13a",
) -> Score:
    """sacreBLEU BLEU of detokenized text against raw references: one list of references, or
    several (each line-aligned with `hypotheses`); cased unless `lowercase`; `tokenize` is one of
    sacreBLEU's tokenizers (13a, intl, zh, ja-mecab, ...; some need extra packages)."""
    metric = BLEU(lowercase=lowercase, tokenize=tokenize)
    score = metric.corpus_score(hypotheses, _streams(references))
    signature = str(metric.get_signature())
    return Score(score.score, signature, score.bp, score.sys_len, score.ref_len)


def corpus_chrf(
    hypotheses: list[str], references: Sequence[str] | Sequence[Sequence[str]]
) -> Score:
    """sacreBLEU chrF of detokenized text against raw references (one list, or several)."""
    metric = CHRF()
    value = metric.corpus_score(hypotheses, _streams(references)).score
    return Score(value, str(metric.get_signature()))


def perplexity(nll_sum: float, tokens: int) -> float:
    """exp of the mean negative log-likelihood per token (capped so it stays a finite float)."""
    return math.exp(min(nll_sum / max(tokens, 1), 50.0))
