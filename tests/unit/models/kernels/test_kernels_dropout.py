"""The dropout kernel (seq2seq.models.kernels.dropout): nn.Dropout's distribution and scaling, its
mask drawn from uniform numbers."""

import pytest
import torch

from seq2seq.models.kernels.dropout import UniformDropout as Dropout


@pytest.mark.parametrize("p", [0.1, 0.3])
def test_drops_a_fraction_p_scales_the_rest_and_passes_gradients_through_the_same_mask(p) -> None:
    torch.manual_seed(0)
    x = torch.rand(1000, 1000).add_(0.5).requires_grad_()  # no zeros of its own
    y = Dropout(p)(x)
    dropped = y == 0
    assert abs(dropped.float().mean().item() - p) < 0.003  # 1M draws: sd 0.0005
    torch.testing.assert_close(y[~dropped], x[~dropped] / (1 - p))
    y.backward(torch.ones_like(y))
    assert torch.equal(x.grad == 0, dropped)
    torch.testing.assert_close(x.grad[~dropped], torch.full_like(x.grad[~dropped], 1 / (1 - p)))


def test_seeded_masks_repeat_eval_is_the_identity_and_the_dtype_is_kept() -> None:
    x = torch.randn(64, 32).add_(10)
    masks = []
    for _ in range(2):
        torch.manual_seed(3)
        masks.append(Dropout(0.3)(x) == 0)
    assert torch.equal(*masks) and masks[0].any()
    assert torch.equal(Dropout(0.3).eval()(x), x)
    assert Dropout(0.3)(x.bfloat16()).dtype == torch.bfloat16
