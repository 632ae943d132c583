"""Corpus metrics: sacreBLEU BLEU and chrF with their signatures, perplexity, attention entropy."""

import math
from dataclasses import dataclass

import torch
from sacrebleu.metrics import BLEU, CHRF
from torch import Tensor


@dataclass
class Score:
    """One corpus-level score and the sacreBLEU signature that makes it reproducible."""

    value: float
    signature: str


def corpus_bleu(hypotheses: list[str], references: list[str], lowercase: bool = False) -> Score:
    """sacreBLEU BLEU (13a tokenization, cased unless `lowercase`) of detokenized text against raw refs."""
    metric = BLEU(lowercase=lowercase)
    value = metric.corpus_score(hypotheses, [references]).score
    return Score(value, str(metric.get_signature()))


def corpus_chrf(hypotheses: list[str], references: list[str]) -> Score:
    """sacreBLEU chrF of detokenized text against raw references."""
    metric = CHRF()
    value = metric.corpus_score(hypotheses, [references]).score
    return Score(value, str(metric.get_signature()))


def perplexity(nll_sum: float, tokens: int) -> float:
    """exp of the mean negative log-likelihood per token (capped so it stays a finite float)."""
    return math.exp(min(nll_sum / max(tokens, 1), 50.0))


def attention_entropy(weights: Tensor, tgt_mask: Tensor) -> Tensor:
    """Mean entropy (nats) of the attention rows at real target positions.

    Args:
        weights: (B, T, S) or (B, T, N, S) attention weights; padding already has weight 0.
        tgt_mask: (B, T) bool, True at real target positions.

    Returns:
        A scalar tensor: low when attention is sharp, log(S) when it is uniform.
    """
    weights = weights.float()
    plogp = torch.where(weights > 0, weights * weights.clamp_min(1e-12).log(), 0.0)
    entropy = -plogp.sum(-1)  # (B, T) or (B, T, N)
    if entropy.dim() == 3:
        entropy = entropy.mean(-1)  # (B, T): mean over heads
    return entropy[tgt_mask].mean()
