"""Attention: scoring functions, the masked softmax, and reading a context vector.

For a query q, keys k_1..k_S and values v_1..v_S (in the RNN, q = s_{t-1} and k_j = v_j = h_j):

    scores   e_j = a(q, k_j)
    weights  alpha = softmax(e) over the unmasked positions only
    context  c = sum_j alpha_j v_j

| scorer     | a(q, k)                      | parameters      |
|------------|------------------------------|-----------------|
| `additive` | w_v^T tanh(W_q q + W_k k)    | W_q, W_k, w_v   |
| `dot`      | q^T k                        | none            |
| `scaled`   | q^T k / sqrt(d_k)            | none            |

Every scorer splits its work in two: `project_keys(keys)` runs once per batch (W_k k_j does not depend on
the decoder step), and `forward(query, proj_keys)` runs once per step. The projected keys are a value the
caller keeps and passes back in, so nothing is hidden on the module and beam search can tile them. Each
states its own cost too: `flops(src_len)`, the matmul FLOPs of projecting the keys and of scoring one
query, and `tanh_size`, the tanh elements a (query, key) pair costs, which the server's work budget reads.

A scorer is built by name from `SCORERS` (the one list of them, which `--score` offers), always as
`scorer(query_size, key_size, attn_size)`; a new one written in these terms is a class and a line there.

Masks are boolean with True = attend. Dimension letters (the table in seq2seq.models.interface): B batch,
S source length, H query and key size (additive attention allows the two to differ), A attention size.

The Transformer's multi-head attention, built on `masked_softmax`, is in seq2seq.models.multihead.
These modules are the specification: the speed paths that training and decoding plug in
(seq2seq.models.kernels) are tested against them.
"""

import math

import torch
from torch import Tensor, nn


def lengths_to_mask(lengths: Tensor, max_len: int | None = None) -> Tensor:
    """Boolean mask (B, max_len), True on the first `lengths[b]` positions of each row."""
    max_len = int(lengths.max()) if max_len is None else max_len
    positions = torch.arange(max_len, device=lengths.device)  # (S,)
    return positions.unsqueeze(0) < lengths.unsqueeze(1)  # (B, S)


def masked_softmax(scores: Tensor, mask: Tensor) -> Tensor:
    """Softmax over the last axis restricted to positions where `mask` is True.

    Padding gets exactly zero weight. A row with no True entry comes back as all zeros, with finite
    values and gradients, in fp32, fp16 and bf16 alike.
    """
    # The dtype's lowest finite value instead of -inf: an all-masked row then softmaxes to a finite
    # uniform row (not NaN), which the multiplication by the mask turns into zeros.
    lowest = torch.finfo(scores.dtype).min
    weights = scores.masked_fill(~mask, lowest).softmax(dim=-1)
    return weights * mask  # (..., S)


def attend(scores: Tensor, mask: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
    """Turn scores into weights and read the context from `values`.

    Args:
        scores: (B, S) one query's scores against every key.
        mask: (B, S) bool, True = real token.
        values: (B, S, H).

    Returns:
        context (B, H) and weights (B, S); each row of weights sums to 1 over real tokens.
    """
    weights = masked_softmax(scores, mask)  # (B, S)
    context = torch.bmm(weights.unsqueeze(1), values).squeeze(1)  # (B, H)
    return context, weights


class AdditiveScorer(nn.Module):
    """Bahdanau's score w_v^T tanh(W_q q + W_k k); keys are projected once per batch by `project_keys`.

    `attn_size` A, the size of W_q q and W_k k, defaults to `key_size`.
    """

    def __init__(self, query_size: int, key_size: int, attn_size: int | None = None) -> None:
        super().__init__()
        attn_size = attn_size or key_size
        self.query_proj = nn.Linear(query_size, attn_size, bias=False)  # W_q
        self.key_proj = nn.Linear(key_size, attn_size, bias=False)  # W_k
        self.energy = nn.Linear(attn_size, 1, bias=False)  # w_v
        self.tanh_size = attn_size  # tanh(W_q q + W_k k) is A elements a (query, key) pair

    def project_keys(self, keys: Tensor) -> Tensor:
        """W_k k_j for every key, once per batch (it does not depend on the decoder step).

        Args: keys (B, S, H). Returns proj_keys (B, S, A).
        """
        return self.key_proj(keys)  # (B, S, A)

    def forward(self, query: Tensor, proj_keys: Tensor) -> Tensor:
        """Args: query (B, H); proj_keys (B, S, A) from `project_keys`. Returns scores (B, S)."""
        energy = torch.tanh(self.query_proj(query).unsqueeze(1) + proj_keys)  # (B, S, A)
        return self.energy(energy).squeeze(-1)  # (B, S)

    def flops(self, src_len: Tensor | float) -> tuple[Tensor | float, Tensor | float]:
        """Forward matmul FLOPs (2 a multiply-add) over a source of `src_len` keys: projecting the
        keys, once a sentence (W_k k_j), and scoring one query (W_q q, then w_v^T on S energies)."""
        K, A = self.key_proj.in_features, self.key_proj.out_features
        Q = self.query_proj.in_features
        return src_len * 2 * K * A, 2 * Q * A + src_len * 2 * A


class DotScorer(nn.Module):
    """Luong's dot score q^T k. No parameters; query and key sizes must be equal.

    `attn_size` is not used: the dot product reads q and k as they are, with no size of its own.
    """

    def __init__(self, query_size: int, key_size: int, attn_size: int | None = None) -> None:
        super().__init__()
        if query_size != key_size:
            raise ValueError(
                f"{type(self).__name__} needs query size == key size, got {query_size} and {key_size}"
            )
        self.key_size = key_size
        self.tanh_size = 0  # no tanh

    def project_keys(self, keys: Tensor) -> Tensor:
        """Identity: the dot product reads the keys as they are. (B, S, H) -> (B, S, H)."""
        return keys

    def forward(self, query: Tensor, proj_keys: Tensor) -> Tensor:
        """Args: query (B, H); proj_keys (B, S, H). Returns scores (B, S)."""
        return torch.bmm(proj_keys, query.unsqueeze(-1)).squeeze(-1)  # (B, S)

    def flops(self, src_len: Tensor | float) -> tuple[Tensor | float, Tensor | float]:
        """Forward matmul FLOPs over a source of `src_len` keys: none to project them; q^T k_j for
        each key to score one query (scaling q is elementwise, not counted)."""
        return 0, src_len * 2 * self.key_size


class ScaledDotScorer(DotScorer):
    """Vaswani's scaled dot score q^T k / sqrt(d_k).

    Dividing by sqrt(d_k) keeps the scores' variance near 1 when q and k have unit-variance entries, so the
    softmax does not saturate as the size grows.
    """

    def __init__(self, query_size: int, key_size: int, attn_size: int | None = None) -> None:
        super().__init__(query_size, key_size)
        self.scale = 1.0 / math.sqrt(key_size)

    def forward(self, query: Tensor, proj_keys: Tensor) -> Tensor:
        """Args: query (B, H); proj_keys (B, S, H). Returns scores (B, S)."""
        return super().forward(query * self.scale, proj_keys)  # (B, S); scaling q costs Q, not S


# The scorers by name: `--score`'s choices (seq2seq.models.config) and every test's list are these keys.
SCORERS: dict[str, type[nn.Module]] = {
    "additive": AdditiveScorer,
    "dot": DotScorer,
    "scaled": ScaledDotScorer,
}


def make_scorer(
    name: str, query_size: int, key_size: int, attn_size: int | None = None
) -> nn.Module:
    """The scorer called `name` (a key of SCORERS). `attn_size` (additive only) defaults to `key_size`."""
    if name not in SCORERS:
        raise ValueError(f"unknown scorer {name!r}; choose one of {', '.join(SCORERS)}")
    return SCORERS[name](query_size, key_size, attn_size)
