"""Dropout whose mask a CPU draws from uniform numbers, for less than `nn.Dropout`'s `bernoulli_`.

On a CPU, `nn.Dropout` draws its mask with `bernoulli_`, which costs more than the rest of the op;
`torch.rand` and a comparison give the same distribution for less (why:
docs/results/benchmarks.md#rows-that-end-the-losss-weight-gradient-adam-and-dropout-on-an-avx2-cpu). On a GPU,
`nn.Dropout`'s fused kernel runs as it is.
"""

import torch
from torch import Tensor, nn


def uniform_dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """`F.dropout(x, p, training)` (zero each element with probability p, scale the rest by
    1 / (1 - p)), its mask drawn on a CPU from uniform numbers: kept where the number is >= p.

    Args: x (...). Returns (...), x's dtype.
    """
    if not training or x.device.type != "cpu" or not 0 < p < 1:
        return nn.functional.dropout(x, p, training)
    # Drawn in fp32 whatever x's dtype: bf16 numbers in [0, 1) are too coarse to compare with p.
    keep = torch.rand(x.shape, device=x.device).ge_(p)  # (...) 1.0 where kept
    return x * keep.to(x.dtype).div_(1 - p)  # (...)


class UniformDropout(nn.Dropout):
    """`nn.Dropout` through `uniform_dropout` (in-place dropout stays `nn.Dropout`'s own)."""

    def forward(self, x: Tensor) -> Tensor:
        """Args: x (...). Returns x with elements zeroed and the rest scaled, (...)."""
        if self.inplace:
            return super().forward(x)
        return uniform_dropout(x, self.p, self.training)
