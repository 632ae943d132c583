"""How sharp attention is, and why: statistics of the raw scores e_tj and of the weights alpha_tj.

The softmax reads only differences between a row's scores, so what makes attention diffuse or sharp is
the spread of e_t. over the real source positions of row t; its standard deviation is the figure that
explains a scorer (`scaled` divides q^T k by sqrt(d_k): about 22.6 at d_k = 512, which flattens the
softmax when the GRU's tanh-bounded states do not have the unit-variance entries that the division
assumes). Three means per real target row:

| key          | what                                                         | sharp | diffuse |
|--------------|--------------------------------------------------------------|-------|---------|
| `attn_entropy` | -sum_j alpha_tj log alpha_tj (nats)                        | 0     | log S   |
| `max_weight` | max_j alpha_tj                                               | 1     | 1 / S   |
| `score_std`  | standard deviation of e_tj over real source positions j      | large | 0       |

Scores are read with a forward hook on the decoder's scorer (`recorded_scores`), so the decoder's own
code is untouched; models without one scorer module (the Transformer) report no `score_std`.
Dimension letters: B batch, T target length, S source length, N heads.
"""

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

KEYS = ("attn_entropy", "max_weight", "score_std")


@contextlib.contextmanager
def recorded_scores(model: nn.Module) -> Iterator[list[Tensor]]:
    """Collect the raw scores (rows, S) of every decoder step while the block runs.

    Yields a list that fills with one (rows, S) tensor per call of `model.decoder.scorer`; it stays empty
    for a model without such a module, or when a compiled graph skips the hook.
    """
    recorded: list[Tensor] = []
    scorer = getattr(getattr(model, "decoder", None), "scorer", None)
    if not isinstance(scorer, nn.Module):
        yield recorded
        return
    handle = scorer.register_forward_hook(
        lambda module, args, scores: recorded.append(scores.detach())
    )
    try:
        yield recorded
    finally:
        handle.remove()


def stacked_scores(recorded: list[Tensor], steps: int) -> Tensor | None:
    """The last `steps` recorded scores as (B, T, S); None when fewer were recorded.

    A step records (n, S) for the n leading rows still decoding (the GRU decoder drops rows whose
    target has ended, seq2seq.models.rnn); the rows it skipped are padding, and get zeros.
    """
    if len(recorded) < steps or steps == 0:
        return None
    last = recorded[-steps:]
    B = last[0].size(0)  # the first step runs every row
    return torch.stack([F.pad(s, (0, 0, 0, B - s.size(0))) for s in last], dim=1)  # (B, T, S)


def row_sums(weights: Tensor, tgt_mask: Tensor, src_mask: Tensor, scores: Tensor | None) -> Tensor:
    """Sums over the real target rows of a batch, for means that no batching changes.

    Args:
        weights: (B, T, S) or (B, T, N, S) attention weights, padding already 0.
        tgt_mask: (B, T) bool, True at real target rows.
        src_mask: (B, S) bool, True at real source positions.
        scores: (B, T, S) raw scores, or None.

    Returns:
        (4,) float64 on the CPU: entropy sum, max-weight sum, score-std sum (0 without scores), rows.
    """
    rows = tgt_mask.sum()
    entropy = attention_entropy(weights, tgt_mask) * rows
    peak = weights.float().amax(-1)  # (B, T) or (B, T, N)
    if peak.dim() == 3:
        peak = peak.mean(-1)  # (B, T): mean over heads
    spread = torch.zeros(())
    if scores is not None:
        real = src_mask[:, None, :].float()  # (B, 1, S)
        count = real.sum(-1)  # (B, 1)
        mean = (scores.float() * real).sum(-1, keepdim=True) / count[..., None]  # (B, T, 1)
        var = ((scores.float() - mean) ** 2 * real).sum(-1) / count  # (B, T)
        spread = var.sqrt()[tgt_mask].sum()
    parts = [entropy, peak[tgt_mask].sum(), spread, rows]
    return torch.stack([part.detach().double().cpu() for part in parts])  # (4,)


def means(sums: Tensor, with_scores: bool) -> dict[str, float | None]:
    """`KEYS` from summed `row_sums`; `score_std` is None when no scores were recorded."""
    entropy, peak, spread, rows = sums.tolist()
    rows = max(rows, 1.0)
    return {
        "attn_entropy": entropy / rows,
        "max_weight": peak / rows,
        "score_std": spread / rows if with_scores else None,
    }


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
