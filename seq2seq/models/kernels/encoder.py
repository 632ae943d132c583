"""The bidirectional GRU encoder of seq2seq.models.rnn, unpacked when a CPU computes gradients.

`BiGRUEncoder` runs `nn.GRU` over packed sequences. The packed CPU kernel slices its precomputed input
gates a step at a time, and each slice's backward fills a (tokens, 3H/2) gradient; so when a CPU
trains, `UnpackedBiGRUEncoder` runs each direction as its own call over the padded batch, the backward
one over each row reversed within its length (why:
docs/results/benchmarks.md#the-encoder-unpacked-in-training-the-scorers-factor-2-on-an-avx2-cpu). Without
gradients packed stays faster, as it computes no padding.

Dimension letters (the table in seq2seq.models.interface): B batch, S source length, E embedding,
H hidden.
"""

import torch
from torch import Tensor

from seq2seq.models.attention import lengths_to_mask
from seq2seq.models.kernels.dropout import uniform_dropout
from seq2seq.models.rnn import BiGRUEncoder


class UnpackedBiGRUEncoder(BiGRUEncoder):
    """`BiGRUEncoder` with its GRU's weights run one direction at a time over the padded batch when a
    CPU computes gradients; packed otherwise. Same parameters, same outputs and gradients."""

    def forward(self, src: Tensor, src_lens: Tensor) -> Tensor:
        """Args: src (B, S) ids; src_lens (B,). Returns enc_out (B, S, H), zero on padding."""
        if src.device.type != "cpu" or not torch.is_grad_enabled():
            return super().forward(src, src_lens)  # (B, S, H)
        emb = self.dropout(self.embedding(src))  # (B, S, E)
        return self.unpacked(emb, src_lens)  # (B, S, H)

    def unpacked(self, emb: Tensor, src_lens: Tensor) -> Tensor:
        """The GRU of `self.rnn`, its weights, one direction at a time over the padded batch.

        Args: emb (B, S, E); src_lens (B,). Returns (B, S, H), zero on padding. What a direction
        computes at padding positions only ever reaches later padding positions, which are zeroed.
        """
        B, S, _ = emb.shape
        positions = torch.arange(S, device=emb.device)  # (S,)
        real = lengths_to_mask(src_lens, S)  # (B, S)
        # Each row reversed within its length (position j <-> len - 1 - j), padding left in place.
        flip = torch.where(real, src_lens.unsqueeze(1) - 1 - positions, positions)  # (B, S)
        h0 = emb.new_zeros(1, B, self.rnn.hidden_size)  # (1, B, H/2)
        x = emb  # (B, S, in)
        for layer in range(self.rnn.num_layers):
            if layer:  # nn.GRU's dropout between layers, which packed runs inside the GRU
                x = uniform_dropout(x, self.rnn.dropout, self.training)
            reversed_x = x.gather(1, flip.unsqueeze(-1).expand_as(x))  # (B, S, in)
            forward = self.direction(x, h0, f"l{layer}")  # (B, S, H/2)
            backward = self.direction(reversed_x, h0, f"l{layer}_reverse")  # (B, S, H/2)
            backward = backward.gather(1, flip.unsqueeze(-1).expand_as(backward))  # back in order
            x = torch.cat([forward, backward], dim=-1)  # (B, S, H)
        return x * real.unsqueeze(-1)  # (B, S, H)

    def direction(self, x: Tensor, h0: Tensor, suffix: str) -> Tensor:
        """One layer and direction of `self.rnn` (its weights named `*_{suffix}`), left to right.
        Args: x (B, S, in); h0 (1, B, H/2). Returns outputs (B, S, H/2)."""
        weights = [getattr(self.rnn, f"{name}_{suffix}") for name in ("weight_ih", "weight_hh")]
        biases = [getattr(self.rnn, f"{name}_{suffix}") for name in ("bias_ih", "bias_hh")]
        # gru(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first)
        out, _ = torch.gru(x, h0, weights + biases, True, 1, 0.0, self.training, False, True)
        return out  # (B, S, H/2)
