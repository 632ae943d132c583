"""Multi-head scaled dot-product attention: the Transformer's attention, on the masked softmax of
seq2seq.models.attention.

`MultiHeadAttention` splits its work like the RNN's scorers: `project_kv` projects keys and values
once (cross-attention: once per sentence; self-attention: one new step at a time, appended to a cache
the caller keeps), and `attend_kv` attends to them.

Masks are boolean with True = attend. Dimension letters (the table in seq2seq.models.interface): B batch,
T query length, S key length, H the model width, N the number of heads and D = H / N the head size.
"""

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seq2seq.models.attention import masked_softmax


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
    The one branch is whether the weights are returned: without, the fused `scaled_dot_product_attention`
    computes this; with them, an explicit path through `masked_softmax` does, and returns the weights per
    head before dropout (they are the alignments we log; dropout only touches the copy that reads the
    values). Both paths agree, and give zeros (before W_o) for a query with no key to attend to. Given
    the same parameters, the output and per-head weights equal `torch.nn.MultiheadAttention`'s. (The
    kernel seq2seq.models.kernels.multihead hands a causal mask alone to the fused kernel as
    `is_causal`.)

    `q_proj`, `k_proj` and `v_proj` run as three matmuls even when their input is one tensor: one merged
    matmul (weights concatenated at call time) was no faster on a CPU for a training batch, and slower
    for a decoding step's few rows, where copying the weights costs more than it saves.
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
        B, N, T, D = q.shape
        S = k.size(2)
        # (B, 1, T, S), or fewer leading sizes where they broadcast; None when nothing is masked
        mask = attention_mask(key_padding_mask, causal, T, S, q.device)
        p = self.dropout if self.training else 0.0
        weights = None
        if need_weights:
            # Scaling q rather than the scores costs T * D multiplications instead of T * S.
            scores = (q * D**-0.5) @ k.transpose(-2, -1)  # (B, N, T, S)
            weights = scores.softmax(-1) if mask is None else masked_softmax(scores, mask)
            context = F.dropout(weights, p, self.training) @ v  # (B, N, T, D)
        else:
            # The same math, fused. A query with no key gets a zero context here too: recent torch
            # zeroes such rows (its math reference uses a "safe" softmax; torch before 2.5 gave NaN).
            # Guarding it ourselves slows the CPU kernel down, so tests/unit/models/test_mha.py checks torch's
            # behaviour instead.
            context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
        output = context.transpose(1, 2).reshape(B, T, N * D)  # (B, T, H)
        return self.out_proj(output), weights
