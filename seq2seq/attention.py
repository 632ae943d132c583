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

Masks are boolean with True = attend. Dimension letters (the table in seq2seq.interface): B batch,
S source length, H query and key size (additive attention allows the two to differ), A attention size.

`MultiHeadAttention` (the Transformer's) splits the same way: `project_kv` projects keys and values once
(cross-attention: once per sentence; self-attention: one step at a time, appended to the caller's cache),
`attend_kv` attends to them. There T is the query length, N the heads and D = H / N the head size.
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

    Padding gets exactly zero weight; a row with no True entry gives zeros, with finite values and
    gradients, in fp32, fp16 and bf16 alike.
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
        """Args: keys (B, S, H). Returns W_k k, (B, S, A)."""
        return self.key_proj(keys)  # (B, S, A)

    # Sources longer than this are scored by AdditiveEnergy, which recomputes tanh(W_q q + W_k k) in
    # backward instead of keeping it. A token-budget batch keeps about budget x S x A floats of it over
    # all decoder steps: 100 MB at S = 24 for 2,048 tokens and A = 512, 400 MB at S = 100. Shorter
    # batches, most of them, keep it: recomputing costs an add and a tanh per step.
    RECOMPUTE_ABOVE = 24

    def forward(self, query: Tensor, proj_keys: Tensor) -> Tensor:
        """Args: query (B, H); proj_keys (B, S, A) from `project_keys`. Returns scores (B, S)."""
        proj_query = self.query_proj(query)  # (B, A)
        long = proj_keys.size(1) > self.RECOMPUTE_ABOVE and torch.is_grad_enabled()
        if long and not torch.compiler.is_compiling():  # compiled: seq2seq.fast recomputes itself
            return AdditiveEnergy.apply(proj_query, proj_keys, self.energy.weight)  # (B, S)
        energy = torch.tanh(proj_query.unsqueeze(1) + proj_keys)  # (B, S, A)
        return self.energy(energy).squeeze(-1)  # (B, S)


class AdditiveEnergy(torch.autograd.Function):
    """w_v^T tanh(q + k_j) for every j, keeping nothing of size B x S x A for backward.

    Autograd would keep tanh(...) (B, S, A) for every decoder step until backward: on long batches the
    largest part of training memory. Backward recomputes it from q and the projected keys instead, which
    are kept anyway.
    """

    @staticmethod
    def forward(ctx, proj_query: Tensor, proj_keys: Tensor, weight: Tensor) -> Tensor:
        # proj_query (B, A), proj_keys (B, S, A), weight (1, A) -> scores (B, S)
        ctx.save_for_backward(proj_query, proj_keys, weight)
        energy = torch.tanh(proj_query.unsqueeze(1) + proj_keys)  # (B, S, A)
        return F.linear(energy, weight).squeeze(-1)  # (B, S)

    @staticmethod
    def backward(ctx, grad_scores: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        proj_query, proj_keys, weight = ctx.saved_tensors
        energy = torch.tanh(proj_query.unsqueeze(1) + proj_keys)  # (B, S, A), recomputed
        grad = grad_scores.to(energy.dtype)  # (B, S)
        grad_weight = grad.reshape(1, -1) @ energy.reshape(-1, energy.size(-1))  # (1, A)
        grad_energy = grad.unsqueeze(-1) * weight.to(energy.dtype)  # (B, S, A)
        grad_pre = torch.ops.aten.tanh_backward(grad_energy, energy)  # (B, S, A): * (1 - tanh^2)
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


def attention_mask(
    key_padding_mask: Tensor | None, causal: bool, T: int, S: int, device: torch.device
) -> Tensor | None:
    """The boolean mask (True = attend) that multi-head attention applies, or None when nothing is masked.

    Args:
        key_padding_mask: (B, S) bool, True = real key; None = every key is real.
        causal: forbid each query the keys after it. Queries are aligned to the last T keys (query t sits at
            position S - T + t), which is where they stand when a cache holds the S - T earlier keys.
        T, S: query and key lengths.

    Returns:
        (B, 1, T, S), (B, 1, 1, S), (T, S) or None; broadcastable to the scores (B, N, T, S).
    """
    mask = None if key_padding_mask is None else key_padding_mask[:, None, None, :]  # (B, 1, 1, S)
    if causal and T > 1:  # a single query is the last position: every key given is in its past
        past = torch.ones(T, S, dtype=torch.bool, device=device).tril(S - T)  # (T, S)
        mask = past if mask is None else mask & past  # (B, 1, T, S)
    return mask


class MultiHeadAttention(nn.Module):
    """Multi-head scaled dot-product attention (Vaswani et al., 2017).

        head_i = softmax(Q W_q^i (K W_k^i)^T / sqrt(D)) V W_v^i          i = 1..N,  D = H / N
        MultiHead(Q, K, V) = [head_1; ...; head_N] W_o

    The scores are divided by sqrt(D), the head size, not sqrt(H): each head's dot product sums D terms.
    Without weights requested, the fused `scaled_dot_product_attention` computes this; with them, an
    explicit path through `masked_softmax` does, and returns the weights per head before dropout (they are
    the alignments we log; dropout only touches the copy that reads the values). Both paths agree, and give
    zeros (before W_o) for a query with no key to attend to. Given the same parameters, the output and
    per-head weights equal `torch.nn.MultiheadAttention`'s.
    """

    def __init__(
        self, d_model: int, num_heads: int, dropout: float = 0.0, bias: bool = True
    ) -> None:
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"d_model {d_model} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.head_size = d_model // num_heads
        self.dropout = dropout
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)  # W_q
        self.k_proj = nn.Linear(d_model, d_model, bias=bias)  # W_k
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)  # W_v
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)  # W_o

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        key_padding_mask: Tensor | None = None,
        causal: bool = False,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Args:
            query: (B, T, H); key, value: (B, S, H).
            key_padding_mask: (B, S) bool, True = attend.
            causal: forbid each query the keys after its position (see `attention_mask`).
            need_weights: also return the weights (takes the explicit path).

        Returns:
            output (B, T, H) and weights (B, N, T, S), or None when not requested.
        """
        k, v = self.project_kv(key, value)  # (B, N, S, D) each
        return self.attend_kv(query, k, v, key_padding_mask, causal, need_weights)

    def project_kv(self, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values split into heads, to cache and pass to `attend_kv`: (B, S, H) -> 2 x (B, N, S, D)."""
        return self._split(self.k_proj(key)), self._split(self.v_proj(value))

    def attend_kv(
        self,
        query: Tensor,
        k: Tensor,
        v: Tensor,
        key_padding_mask: Tensor | None = None,
        causal: bool = False,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """`forward` with keys and values already projected by `project_kv`: k, v (B, N, S, D)."""
        q = self._split(self.q_proj(query))  # (B, N, T, D)
        return self._attend(q, k, v, key_padding_mask, causal, need_weights)

    def _split(self, x: Tensor) -> Tensor:
        B, T, _ = x.shape
        return x.view(B, T, self.num_heads, self.head_size).transpose(1, 2)  # (B, N, T, D)

    def _attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        key_padding_mask: Tensor | None,
        causal: bool,
        need_weights: bool,
    ) -> tuple[Tensor, Tensor | None]:
        (B, N, T, D), S = q.shape, k.size(2)
        # (B, 1, T, S), or fewer leading sizes where they broadcast; None when nothing is masked
        mask = attention_mask(key_padding_mask, causal, T, S, q.device)
        p = self.dropout if self.training else 0.0
        weights = None
        if need_weights:
            # Scaling q rather than the scores costs T * D multiplications instead of T * S.
            scores = (q * D**-0.5) @ k.transpose(-2, -1)  # (B, N, T, S)
            weights = scores.softmax(-1) if mask is None else masked_softmax(scores, mask)
            context = F.dropout(weights, p, self.training) @ v  # (B, N, T, D)
        elif mask is None or (key_padding_mask is None and T == S):
            # Causal alone with T == S: the fused kernel's own (top-left) causal mask is ours, and it can
            # skip the masked blocks instead of reading a mask.
            is_causal = causal and T > 1
            context = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=is_causal)
        else:
            # A query with no key gets a zero context: torch >= 2.5 zeroes such rows (older gave NaN);
            # guarding it here cost +25% on CPU, so tests/test_mha.py checks torch's behaviour instead.
            context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
        output = context.transpose(1, 2).reshape(B, T, N * D)  # (B, T, H)
        return self.out_proj(output), weights
