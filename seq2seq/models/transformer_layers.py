"""The Transformer's parts (Vaswani et al., 2017): the sinusoidal positional table, the feed-forward
sublayer, and the encoder and decoder layers, pre-LN or post-LN (the formulas are in the docstring of
seq2seq.models.transformer, which assembles them).

Dimension letters (the table in seq2seq.models.interface): B batch, S source length, T target length,
H d_model, N heads, D = H / N head size, F feed-forward size.
"""

import math

import torch
from torch import Tensor, nn

from seq2seq.models.multihead import MultiHeadAttention

POSITIONS = 1024  # rows of the positional table: the longest sequence, EOS or BOS included


class PositionalEncoding(nn.Module):
    """The sinusoidal table PE (max_len, H), computed once; `forward` looks positions up in it."""

    def __init__(self, d_model: int, max_len: int = POSITIONS) -> None:
        super().__init__()
        position = torch.arange(max_len).unsqueeze(1)  # (max_len, 1)
        inv_freq = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))  # (H/2,)
        table = torch.zeros(max_len, d_model)  # (max_len, H)
        table[:, 0::2] = torch.sin(position * inv_freq)
        table[:, 1::2] = torch.cos(position * inv_freq)
        # Not persistent: it is a function of the sizes, so checkpoints need not carry it.
        self.register_buffer("table", table, persistent=False)

    @property
    def max_len(self) -> int:
        return self.table.size(0)

    def forward(self, positions: Tensor) -> Tensor:
        """Args: positions (...) long. Returns (..., H)."""
        return self.table[positions]


def feed_forward(d_model: int, ff_size: int, dropout: float) -> nn.Sequential:
    """W_2 Dropout(ReLU(W_1 x)): (..., H) -> (..., F) -> (..., H)."""
    return nn.Sequential(
        nn.Linear(d_model, ff_size), nn.ReLU(), nn.Dropout(dropout), nn.Linear(ff_size, d_model)
    )


class _Layer(nn.Module):
    """What encoder and decoder layers share: self-attention, feed-forward, and where the LayerNorm sits
    around each sublayer (before it for pre-LN; after the residual sum for post-LN)."""

    def __init__(
        self,
        d_model: int,
        heads: int,
        ff_size: int,
        dropout: float,
        attn_dropout: float,
        post_ln: bool,
    ) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, heads, attn_dropout)
        self.ff = feed_forward(d_model, ff_size, dropout)
        self.norm_self, self.norm_ff = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)
        self.post_ln = post_ln

    def sublayer_input(self, x: Tensor, norm: nn.LayerNorm) -> Tensor:
        return x if self.post_ln else norm(x)

    def add(self, x: Tensor, y: Tensor, norm: nn.LayerNorm) -> Tensor:
        """The residual sum of the stream x and a sublayer's output y, both (B, T, H)."""
        x = x + self.dropout(y)
        return norm(x) if self.post_ln else x

    def feed_forward(self, x: Tensor) -> Tensor:
        return self.add(x, self.ff(self.sublayer_input(x, self.norm_ff)), self.norm_ff)


class EncoderLayer(_Layer):
    """Self-attention over the source, then the feed-forward; each inside a residual."""

    def forward(self, x: Tensor, src_mask: Tensor) -> Tensor:
        """Args: x (B, S, H); src_mask (B, S) bool. Returns (B, S, H)."""
        h = self.sublayer_input(x, self.norm_self)
        x = self.add(x, self.self_attn(h, h, h, key_padding_mask=src_mask)[0], self.norm_self)
        return self.feed_forward(x)


class DecoderLayer(_Layer):
    """Causal self-attention, cross-attention to the encoder output, feed-forward; each inside a residual."""

    def __init__(
        self,
        d_model: int,
        heads: int,
        ff_size: int,
        dropout: float,
        attn_dropout: float,
        post_ln: bool,
    ) -> None:
        super().__init__(d_model, heads, ff_size, dropout, attn_dropout, post_ln)
        self.cross_attn = MultiHeadAttention(d_model, heads, attn_dropout)
        self.norm_cross = nn.LayerNorm(d_model)

    def forward(
        self,
        x: Tensor,
        cross_k: Tensor,
        cross_v: Tensor,
        memory_mask: Tensor,
        cache: tuple[Tensor, Tensor] | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None, tuple[Tensor, Tensor] | None]:
        """Args:
            x: (B, T, H) target positions; cross_k, cross_v: (B, N, S, D); memory_mask: (B, S) bool.
            cache: self-attention keys and values of the t earlier positions, (B, N, t, D) each; None
                when x holds the whole prefix (teacher forcing).
            need_weights: return the cross-attention weights.

        Returns:
            x (B, T, H), cross-attention weights (B, N, T, S) or None, and the grown cache (B, N, t + T, D)
            or None.
        """
        h = self.sublayer_input(x, self.norm_self)
        if cache is None:  # teacher forcing: the whole prefix at once, no cache to keep
            y, _ = self.self_attn(h, h, h, causal=True)
        else:
            k, v = self.self_attn.project_kv(h, h)  # (B, N, T, D) each
            k, v = torch.cat([cache[0], k], 2), torch.cat([cache[1], v], 2)  # (B, N, t + T, D)
            y, _ = self.self_attn.attend_kv(h, k, v, causal=True)
            cache = k, v
        x = self.add(x, y, self.norm_self)
        h = self.sublayer_input(x, self.norm_cross)
        y, weights = self.cross_attn.attend_kv(
            h, cross_k, cross_v, memory_mask, need_weights=need_weights
        )
        return self.feed_forward(self.add(x, y, self.norm_cross)), weights, cache
