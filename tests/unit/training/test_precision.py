"""bf16-mixed, the default (`--precision auto`) on a CPU with native bf16: a training step under CPU
autocast gives the loss and gradients of fp32 to within bf16's rounding. Its output layer,
projections and attention run in bf16; the recurrence stays in fp32 (seq2seq.models.kernels.decoder)."""

import pytest
import torch
import torch.nn.functional as F

from seq2seq.models.attention import SCORERS
from seq2seq.models.kernels import accelerate
from seq2seq.models.rnn import RNNSeq2Seq
from seq2seq.training.losses import batch_loss
from tests.unit.benchmarks.test_benchmark import random_batch

# bf16 keeps 8 bits of mantissa: relative rounding up to 2^-8, 0.4%, per operation. Measured on
# this model: the loss 1e-5 apart, each gradient at cosine 0.99999 with fp32's.
LOSS_RTOL = 1e-3
GRAD_COSINE = 0.999


@pytest.mark.parametrize("score", SCORERS)
def test_a_bf16_mixed_step_gives_the_fp32_loss_and_gradients(score: str) -> None:
    torch.manual_seed(0)
    model = accelerate(RNNSeq2Seq(100, emb_size=32, hidden_size=64, score=score, dropout=0.0))
    batch = random_batch(100, [(6, 3), (2, 9), (11, 5), (4, 4), (7, 8)])
    results = []
    for bf16 in (False, True):
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss_sum, _, tokens, _ = batch_loss(model, batch, 0.1)
        loss = loss_sum / tokens
        loss.backward()
        grads = {name: p.grad.clone() for name, p in model.named_parameters()}
        results.append((loss.detach(), grads))
    (loss32, grads32), (loss16, grads16) = results
    assert loss16 != loss32  # bf16 did run somewhere: the comparison below is not of fp32 twice
    torch.testing.assert_close(loss16, loss32, rtol=LOSS_RTOL, atol=0.0)
    assert grads16.keys() == grads32.keys()
    for name, want in grads32.items():
        assert grads16[name].dtype == torch.float32, name  # the optimizer's gradients stay fp32
        cosine = F.cosine_similarity(grads16[name].flatten(), want.flatten(), dim=0)
        assert cosine > GRAD_COSINE, f"{name}: cosine {cosine:.6f}"
