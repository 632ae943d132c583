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
caller keeps and passes back in, so nothing is hidden on the module and beam search can tile them.

Masks are boolean with True = attend. Dimension letters (the table in seq2seq.models.interface): B batch,
S source length, H query and key size (additive attention allows the two to differ), A attention size.

The Transformer's multi-head attention, built on `masked_softmax`, is in seq2seq.models.multihead.
"""

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

SCORERS = ("additive", "dot", "scaled")


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
    """Bahdanau's score w_v^T tanh(W_q q + W_k k); keys are projected once per batch by `project_keys`."""

    def __init__(self, query_size: int, key_size: int, attn_size: int) -> None:
        super().__init__()
        self.query_proj = nn.Linear(query_size, attn_size, bias=False)  # W_q
        self.key_proj = nn.Linear(key_size, attn_size, bias=False)  # W_k
        self.energy = nn.Linear(attn_size, 1, bias=False)  # w_v

    def project_keys(self, keys: Tensor) -> Tensor:
        """Args: keys (B, S, H). Returns 2 W_k k, (B, S, A): doubled for `half_tanh`.

        The 2 is folded into the (A, H) weight here, once per batch, so that no decoder step multiplies
        a (B, S, A) tensor by it, forward or backward.
        """
        return F.linear(keys, 2 * self.key_proj.weight)  # (B, S, A)

    def project_query(self, query: Tensor) -> Tensor:
        """2 W_q q, doubled as the keys are: (B, H) -> (B, A)."""
        return 2 * self.query_proj(query)  # (B, A)

    # Sources longer than this are scored by AdditiveEnergy, which recomputes tanh(W_q q + W_k k) in
    # backward instead of keeping it. A token-budget batch keeps about budget x S x A floats of it over
    # all decoder steps: 100 MB at S = 24 for 2,048 tokens and A = 512, 400 MB at S = 100. Shorter
    # batches, most of them, keep it: recomputing costs an add and a tanh per step.
    RECOMPUTE_ABOVE = 24

    def forward(self, query: Tensor, proj_keys: Tensor) -> Tensor:
        """Args: query (B, H); proj_keys (B, S, A) from `project_keys`. Returns scores (B, S)."""
        proj_query = self.project_query(query)  # (B, A)
        weight = self.energy.weight  # w_v, (1, A)
        if not torch.compiler.is_compiling():  # compiled: seq2seq.models.fast has its own recompute
            if torch.is_grad_enabled() and proj_keys.size(1) > self.RECOMPUTE_ABOVE:
                return AdditiveEnergy.apply(proj_query, proj_keys, weight)  # (B, S)
            if not torch.is_grad_enabled() and proj_keys.device.type == "cpu":
                return scores_in_chunks(proj_query, proj_keys, weight)  # (B, S)
        gate = half_tanh(proj_query, proj_keys)  # (B, S, A)
        return 2 * self.energy(gate).squeeze(-1) - weight.sum()  # (B, S)


def half_tanh(proj_query: Tensor, proj_keys: Tensor) -> Tensor:
    """sigmoid(q + k_j) for every j, with q = 2 W_q s and k_j = 2 W_k h_j: (B, A), (B, S, A) -> (B, S, A).

    tanh(x) = 2 sigmoid(2x) - 1, so w_v^T tanh(W_q s + W_k h_j) = 2 w_v^T sigmoid(q + k_j) - sum(w_v).
    The largest elementwise op of a decoder step costs less that way: on a 2-core AVX2 EPYC (torch
    2.13, 2 threads) tanh of 1M floats took 1.95 ms and sigmoid 0.53 ms. The factors of 2 sit in
    the projections (`AdditiveScorer.project_keys`), not here: an add with a factor gives the keys'
    gradient a (B, S, A) multiplication every step.
    """
    # In place: one (B, S, A) tensor a step instead of two (add's backward does not need its output).
    return torch.add(proj_query.unsqueeze(1), proj_keys).sigmoid_()  # (B, S, A)


# Elements of the (rows, S, A) energies that `scores_in_chunks` holds at once: 4 MB in fp32.
SCORE_CHUNK = 1 << 20


def scores_in_chunks(proj_query: Tensor, proj_keys: Tensor, weight: Tensor) -> Tensor:
    """Additive scores without gradients, as `AdditiveScorer` computes them, a few rows at a time.

    Args: proj_query (B, A) and proj_keys (B, S, A), doubled as for `half_tanh`; weight w_v (1, A).
    Returns scores (B, S).

    A search step's energies are large (B = sentences x beams: 1,500 x 20 x 512 is 60 MB), and on a
    CPU every tensor that size is mapped afresh by glibc and page-faults in. Rows are scored in one
    reused buffer of SCORE_CHUNK elements instead: on a 2-core AVX2 EPYC (torch 2.13, 2 threads) that
    shape took 15.5 ms against 58.6 ms as whole tensors.
    """
    B, S, A = proj_keys.shape
    dtype = torch.result_type(proj_query, proj_keys)
    rows = max(1, SCORE_CHUNK // (S * A))
    buffer = proj_keys.new_empty((min(rows, B), S, A), dtype=dtype)  # (rows, S, A)
    w = weight.reshape(-1).to(dtype)  # (A,)
    query = proj_query.unsqueeze(1)  # (B, 1, A)
    scores = proj_keys.new_empty((B, S), dtype=dtype)  # (B, S)
    for start in range(0, B, rows):
        end = min(start + rows, B)
        gate = buffer[: end - start]  # (rows, S, A)
        torch.add(query[start:end], proj_keys[start:end], out=gate).sigmoid_()
        torch.matmul(gate, w, out=scores[start:end])  # (rows, S)
    return 2 * scores - weight.sum()  # (B, S)


class AdditiveEnergy(torch.autograd.Function):
    """w_v^T tanh((q + k_j) / 2) for every j, keeping nothing of size B x S x A for backward.

    q and k are doubled as `half_tanh` takes them, so this is the additive score
    w_v^T tanh(W_q s + W_k h_j).

    Autograd would keep the (B, S, A) energies for every decoder step until backward: on long batches
    the largest part of training memory. Backward recomputes them from q and the projected keys
    instead, which are kept anyway. As in `AdditiveScorer`, tanh is computed through `half_tanh`.
    """

    @staticmethod
    def forward(ctx, proj_query: Tensor, proj_keys: Tensor, weight: Tensor) -> Tensor:
        # proj_query (B, A), proj_keys (B, S, A), weight (1, A) -> scores (B, S)
        ctx.save_for_backward(proj_query, proj_keys, weight)
        gate = half_tanh(proj_query, proj_keys)  # (B, S, A)
        return 2 * F.linear(gate, weight).squeeze(-1) - weight.sum()  # (B, S)

    @staticmethod
    def backward(ctx, grad_scores: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        proj_query, proj_keys, weight = ctx.saved_tensors
        gate = half_tanh(proj_query, proj_keys)  # (B, S, A), recomputed
        grad = grad_scores.to(gate.dtype)  # (B, S)
        flat = gate.reshape(-1, gate.size(-1))  # (B * S, A)
        grad_weight = 2 * (grad.reshape(1, -1) @ flat) - grad.sum()  # (1, A)
        # d scores / d (q + k) = 2 w * sigmoid'(q + k)
        grad_gate = grad.unsqueeze(-1) * (2 * weight.to(gate.dtype))  # (B, S, A)
        grad_pre = torch.ops.aten.sigmoid_backward(grad_gate, gate)  # (B, S, A)
        return (
            grad_pre.sum(1).to(proj_query.dtype),  # (B, A)
            grad_pre.to(proj_keys.dtype),  # (B, S, A)
            grad_weight.to(weight.dtype),  # (1, A)
        )


class DotScorer(nn.Module):
    """Luong's dot score q^T k. No parameters; query and key sizes must be equal."""

    def __init__(self, query_size: int, key_size: int) -> None:
        super().__init__()
        if query_size != key_size:
            raise ValueError(
                f"{type(self).__name__} needs query size == key size, got {query_size} and {key_size}"
            )
        self.key_size = key_size

    def project_keys(self, keys: Tensor) -> Tensor:
        """Identity: the dot product reads the keys as they are. (B, S, H) -> (B, S, H)."""
        return keys

    def forward(self, query: Tensor, proj_keys: Tensor) -> Tensor:
        """Args: query (B, H); proj_keys (B, S, H). Returns scores (B, S)."""
        return torch.bmm(proj_keys, query.unsqueeze(-1)).squeeze(-1)  # (B, S)


class ScaledDotScorer(DotScorer):
    """Vaswani's scaled dot score q^T k / sqrt(d_k).

    Dividing by sqrt(d_k) keeps the scores' variance near 1 when q and k have unit-variance entries, so the
    softmax does not saturate as the size grows.
    """

    def __init__(self, query_size: int, key_size: int) -> None:
        super().__init__(query_size, key_size)
        self.scale = 1.0 / math.sqrt(key_size)

    def forward(self, query: Tensor, proj_keys: Tensor) -> Tensor:
        """Args: query (B, H); proj_keys (B, S, H). Returns scores (B, S)."""
        return super().forward(query * self.scale, proj_keys)  # (B, S); scaling q costs Q, not S


def make_scorer(
    name: str, query_size: int, key_size: int, attn_size: int | None = None
) -> nn.Module:
    """The scorer called `name` (one of SCORERS). `attn_size` (additive only) defaults to `key_size`."""
    if name == "additive":
        return AdditiveScorer(query_size, key_size, attn_size or key_size)
    if name == "dot":
        return DotScorer(query_size, key_size)
    if name == "scaled":
        return ScaledDotScorer(query_size, key_size)
    raise ValueError(f"unknown scorer {name!r}; choose one of {', '.join(SCORERS)}")
