"""Multi-head attention of seq2seq.models.multihead with a causal mask alone passed as `is_causal`.

For causal self-attention over a whole prefix (T == S) with no padding mask, the fused
`scaled_dot_product_attention`'s own (top-left) causal mask is the model's, and with `is_causal` the
kernel can skip the masked blocks instead of reading a (T, S) mask. Every other call is the textbook
module's.

Dimension letters (the table in seq2seq.models.interface): B batch, T query length, S key length,
N heads, D head size, H the model width.
"""

import torch.nn.functional as F
from torch import Tensor

from seq2seq.models.multihead import MultiHeadAttention


class CausalFusedAttention(MultiHeadAttention):
    """`MultiHeadAttention` whose causal self-attention without padding runs as `is_causal`."""

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
        if need_weights or key_padding_mask is not None or not causal or T != k.size(2) or T == 1:
            return super()._attend(q, k, v, key_padding_mask, causal, need_weights)
        p = self.dropout if self.training else 0.0
        context = F.scaled_dot_product_attention(
            q, k, v, dropout_p=p, is_causal=True
        )  # (B, N, T, D)
        output = context.transpose(1, 2).reshape(B, T, N * D)  # (B, T, H)
        return self.out_proj(output), None
