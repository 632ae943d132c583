"""The Transformer translator (Vaswani et al., 2017), built from seq2seq.models.multihead.MultiHeadAttention.

    x_0 = sqrt(H) emb(y) + PE(pos)       PE(pos, 2i) = sin(pos / 10000^(2i/H)), PE(pos, 2i+1) = cos(...)
    pre-LN  (default):  x = x + Dropout(Sublayer(LN(x)))     and one final LN after the last layer
    post-LN (post_ln):  x = LN(x + Dropout(Sublayer(x)))

An encoder layer has two sublayers (self-attention, feed-forward); a decoder layer three (causal self-
attention, cross-attention to the encoder output, feed-forward). The feed-forward is
W_2 Dropout(ReLU(W_1 x)). Pre-LN trains stably without a long warm-up; post-LN is the original.

Incremental decoding keeps, per decoder layer i, the self-attention keys and values of the steps so far
(`self_k{i}`, `self_v{i}`: (B, N, t, D), one step longer after each `step`) and the cross-attention keys
and values, projected once in `encode` (`cross_k{i}`, `cross_v{i}`: (B, N, S, D)); beside them the
source mask `memory_mask` (B, S) and the next target position `pos` (B,). All are batch-first, so
`reorder_state` serves beam search.

Alignments (`decode` and `step` weights) are the cross-attention of decoder layer `alignment_layer`
(default: the last), one map per head; `alignment_view` reduces them to the mean of the heads, or to
head `alignment_heads` alone: what guided alignment trains, and what alignments and heatmaps read.

Dimension letters (the table in seq2seq.models.interface): B batch, S source length, T target length,
H d_model, N heads, D = H / N head size, F feed-forward size, V vocabulary, L layers.
"""

import math

import torch
from torch import Tensor, nn

from seq2seq.models.interface import Seq2Seq, State
from seq2seq.models.transformer_layers import (
    POSITIONS,
    DecoderLayer,
    EncoderLayer,
    PositionalEncoding,
)


class TransformerSeq2Seq(Seq2Seq):
    """Encoder-decoder Transformer over one joint vocabulary, with cached keys and values for `step`.

    With `tie_embeddings`, the source embedding, target embedding and output layer share one matrix. The
    embeddings start with std H^-0.5 and are scaled by sqrt(H), so the model reads unit-variance vectors
    and the tied output layer starts with logits of std ~1; the linear layers start Xavier-uniform.
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int = 256,
        heads: int = 4,
        layers: int = 3,
        ff_size: int = 1024,
        dropout: float = 0.3,
        attn_dropout: float = 0.1,
        post_ln: bool = False,
        tie_embeddings: bool = True,
        max_len: int = POSITIONS,
        alignment_layer: int = -1,
        alignment_heads: int = -1,
    ) -> None:
        super().__init__()
        if not -layers <= alignment_layer < layers or not -1 <= alignment_heads < heads:
            raise ValueError(
                f"alignment layer {alignment_layer} or head {alignment_heads} out of range for "
                f"{layers} layers of {heads} heads (-1: the last layer; the mean of the heads)"
            )
        self.d_model, self.heads = d_model, heads
        self.alignment_layer = alignment_layer % layers  # (B, T, N, S) weights come from here
        self.alignment_head = None if alignment_heads < 0 else alignment_heads
        sizes = (d_model, heads, ff_size, dropout, attn_dropout, post_ln)
        self.encoder = nn.ModuleList(EncoderLayer(*sizes) for _ in range(layers))
        self.decoder = nn.ModuleList(DecoderLayer(*sizes) for _ in range(layers))
        # Pre-LN leaves the residual stream unnormalised: one LayerNorm closes each stack.
        self.enc_norm = nn.Identity() if post_ln else nn.LayerNorm(d_model)
        self.dec_norm = nn.Identity() if post_ln else nn.LayerNorm(d_model)
        self.positions = PositionalEncoding(d_model, max_len)
        self.dropout = nn.Dropout(dropout)
        self.generator = nn.Linear(d_model, vocab_size)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        self.src_embedding = nn.Embedding(vocab_size, d_model, padding_idx=0)
        self.tgt_embedding = (
            self.src_embedding
            if tie_embeddings
            else nn.Embedding(vocab_size, d_model, padding_idx=0)
        )
        for embedding in {self.src_embedding, self.tgt_embedding}:
            nn.init.normal_(embedding.weight, std=d_model**-0.5)
            nn.init.zeros_(embedding.weight[0])
        if tie_embeddings:
            self.generator.weight = self.tgt_embedding.weight

    def alignment_view(self, weights: Tensor) -> Tensor:
        """(…, N, S) -> (…, S): the mean of the heads, or head `alignment_head` alone."""
        if self.alignment_head is None:
            return weights.mean(-2)  # (…, S)
        return weights[..., self.alignment_head, :]  # (…, S)

    def embed(self, embedding: nn.Embedding, tokens: Tensor, positions: Tensor) -> Tensor:
        """sqrt(H) emb + PE, then dropout. Args: tokens (B, T); positions (T,) or (B, T). Returns (B, T, H)."""
        x = embedding(tokens) * math.sqrt(self.d_model) + self.positions(positions)  # (B, T, H)
        return self.dropout(x)

    @property
    def max_len(self) -> int:
        """The longest source or target the position table covers."""
        return self.positions.max_len

    def _check_length(self, length: int, what: str) -> None:
        if length > self.positions.max_len:
            raise ValueError(f"{what} of {length} tokens exceeds max_len {self.positions.max_len}")

    def encode(self, src: Tensor, src_lens: Tensor, src_mask: Tensor) -> State:
        """Args: src (B, S) ids; src_lens (B,); src_mask (B, S) bool. Returns the decoder's initial state."""
        B, S = src.shape
        self._check_length(S, "a source")
        positions = torch.arange(S, device=src.device)  # (S,)
        x = self.embed(self.src_embedding, src, positions)  # (B, S, H)
        for layer in self.encoder:
            x = layer(x, src_mask)
        memory = self.enc_norm(x)  # (B, S, H)
        pos = torch.zeros(B, dtype=torch.long, device=src.device)  # (B,)
        state = {"memory_mask": src_mask, "pos": pos}
        for i, layer in enumerate(self.decoder):
            # Cross-attention keys and values depend on the source only: projected once per sentence.
            k, v = layer.cross_attn.project_kv(memory, memory)  # (B, N, S, D) each
            empty = k[:, :, :0]  # (B, N, 0, D), in k's dtype (autocast's, when on)
            state.update(
                {f"cross_k{i}": k, f"cross_v{i}": v, f"self_k{i}": empty, f"self_v{i}": empty}
            )
        return state

    def source_state(self, name: str) -> bool:
        return name == "memory_mask" or name.startswith(("cross_k", "cross_v"))

    def _decode(
        self, state: State, x: Tensor, incremental: bool
    ) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        """The decoder stack over embedded targets x (B, T, H); shared by `decode` and `step`.

        Returns features (B, T, H), the alignment layer's cross-attention weights (B, N, T, S) and the
        grown caches.
        """
        caches, weights = {}, None
        for i, layer in enumerate(self.decoder):
            cache = (state[f"self_k{i}"], state[f"self_v{i}"]) if incremental else None
            x, found, cache = layer(
                x,
                state[f"cross_k{i}"],
                state[f"cross_v{i}"],
                state["memory_mask"],
                cache,
                need_weights=i == self.alignment_layer,
            )
            weights = found if i == self.alignment_layer else weights
            if incremental:
                caches[f"self_k{i}"], caches[f"self_v{i}"] = cache
        return self.dec_norm(x), weights, caches

    def decode(self, state: State, tgt_in: Tensor) -> tuple[Tensor, Tensor]:
        """Teacher-forced, from the state `encode` returned. Args: tgt_in (B, T).

        Returns features (B, T, H) and the alignment layer's cross-attention weights (B, T, N, S).
        """
        T = tgt_in.size(1)
        self._check_length(T, "a target")
        positions = torch.arange(T, device=tgt_in.device)  # (T,)
        x = self.embed(self.tgt_embedding, tgt_in, positions)  # (B, T, H)
        features, weights, _ = self._decode(state, x, incremental=False)
        return features, weights.transpose(1, 2)  # (B, T, H), (B, T, N, S)

    def step(
        self, state: State, prev: Tensor, out: Tensor | None = None
    ) -> tuple[Tensor, Tensor, State]:
        """Args: prev (B,) previous tokens; out: a (B, V) buffer for the logits, or None. Returns
        logits (B, V), weights (B, N, S), the new state."""
        # The cache length is the position of every row, known without reading `pos` from the device.
        self._check_length(state["self_k0"].size(2) + 1, "an output")
        pos = state["pos"]  # (B,)
        x = self.embed(self.tgt_embedding, prev.unsqueeze(1), pos.unsqueeze(1))  # (B, 1, H)
        features, weights, caches = self._decode(state, x, incremental=True)
        logits = self.logits(features.squeeze(1), out)  # (B, V)
        return logits, weights.squeeze(2), {**state, **caches, "pos": pos + 1}  # (B, V), (B, N, S)

    def flops_per_token(self, src_len: Tensor | float, tgt_len: Tensor | float) -> Tensor | float:
        """Matmul FLOPs of a training update (forward + backward) per target token of one sentence pair.

        Args: src_len, tgt_len: real source and target tokens (EOS, BOS included); floats, or tensors of
        lengths (B,) for one figure per pair. 2 FLOPs per multiply-add; backward = 2 x forward; padding
        and elementwise work (LayerNorm, softmax) are not counted; causal attention counts half the pairs.
        """
        H, L, V = self.d_model, len(self.encoder), self.generator.out_features
        F = self.encoder[0].ff[0].out_features
        s, t = src_len, tgt_len
        enc = L * s * (8 * H * H + 4 * H * F + 4 * H * s)  # QKVO, feed-forward; scores, context
        dec = L * t * (12 * H * H + 4 * H * F + 4 * H * s)  # self QKVO, cross QO, FF; cross attn
        dec = dec + L * (4 * H * H * s + 2 * H * t * (t + 1))  # cross K, V; causal self-attention
        return 3 * (enc + dec + 2 * H * V * t) / t
