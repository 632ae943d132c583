"""The training loss: label-smoothed cross-entropy over the real target tokens of a batch.

    loss = sum_t (1 - eps) * -log p(y_t) + eps * mean_v(-log p(v))          (Szegedy et al., 2016)

The NLL (eps = 0) comes out of the same pass: it is what perplexity reports.
"""

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from seq2seq.models.interface import Seq2Seq


def smoothed_nll(logits: Tensor, target: Tensor, smoothing: float) -> tuple[Tensor, Tensor]:
    """Label-smoothed cross-entropy and plain NLL, both summed. logits (N', V), target (N,), N <= N':
    rows past N are padding, with no loss and a zero gradient.

    One log-softmax serves both: the loss to optimise and the NLL behind perplexity.
    """
    return SmoothedCrossEntropy.apply(logits, target, smoothing)


class SmoothedCrossEntropy(torch.autograd.Function):
    """`smoothed_nll` with a hand-written backward: one (N, V) buffer instead of autograd's chain.

    Autograd would differentiate the mean, the gather and the log-softmax one after the other, each with
    its own (N, V) tensor: with N of 2,000 tokens and V of 8,000 that is 64 MB apiece. The gradient in
    closed form is softmax(logits) - q, with q the smoothed target distribution.
    """

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, smoothing: float) -> tuple[Tensor, Tensor]:
        # At least fp32: bf16 logits (autocast) are widened; float64 (gradcheck) stays as it is.
        log_probs = logits.to(torch.promote_types(logits.dtype, torch.float32)).log_softmax(-1)
        real = log_probs[: len(target)]  # (N, V)
        nll = -real.gather(1, target.unsqueeze(1)).squeeze(1)  # (N,)
        uniform = -real.mean(-1)  # (N,) cross-entropy against the uniform distribution
        loss = (1.0 - smoothing) * nll + smoothing * uniform  # (N,)
        ctx.save_for_backward(log_probs, target)
        ctx.smoothing, ctx.logits_dtype = smoothing, logits.dtype
        return loss.sum(), nll.sum()

    @staticmethod
    def backward(ctx, grad_loss: Tensor, grad_nll: Tensor) -> tuple[Tensor, None, None]:
        log_probs, target = ctx.saved_tensors
        eps, vocab = ctx.smoothing, log_probs.size(-1)
        # d loss / d logits = p - (1 - eps) onehot - eps / V;  d nll / d logits = p - onehot.
        grad = log_probs.exp().mul_(grad_loss + grad_nll).sub_(grad_loss * (eps / vocab))  # (N', V)
        rows = torch.arange(len(target), device=target.device)  # (N,)
        grad[rows, target] -= grad_loss * (1.0 - eps) + grad_nll
        grad[len(target) :] = 0  # padding rows
        return grad.to(ctx.logits_dtype), None, None


# The output layer's row count is a batch's real target tokens, new with almost every batch. Under bf16
# autocast on a CPU each new shape of that (N_tok, V) matmul is a oneDNN primitive whose memory is not
# given back (see seq2seq.models.rnn._fp32_on_cpu for the rest of the story). Rounded up to a multiple of 64
# (at most 63 zero rows, which get no loss: 3% at the default 2,048-token batches), at most
# batch_tokens / 64 shapes occur.
ROWS = 64


def batch_loss(
    model: Seq2Seq, batch: dict[str, Tensor], label_smoothing: float
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Teacher-forced loss of a batch: smoothed loss sum, NLL sum, real token count, attention weights.

    The output layer runs once, on the real target positions only, their count rounded up to a multiple
    of ROWS: the few zero rows keep the number of shapes it sees small (see ROWS).
    """
    state = model.encode(batch["src"], batch["src_lens"], batch["src_mask"])
    features, weights = model.decode(state, batch["tgt_in"])  # (B, T, O), (B, T, [N,] S)
    mask = batch["tgt_mask"]  # (B, T)
    rows = features[mask]  # (N_tok, O)
    logits = model.generator(F.pad(rows, (0, 0, 0, -len(rows) % ROWS)))  # (N', V), N' = N_tok + pad
    loss_sum, nll_sum = smoothed_nll(logits, batch["tgt_out"][mask], label_smoothing)
    return loss_sum, nll_sum, mask.sum(), weights


Cost = Literal["ce", "mse"]  # guided alignment's cost (seq2seq.data.links describes both)
EPS = 1e-9  # log(A) of a linked piece with no attention stays finite


def alignment_loss(weights: Tensor, reference: Tensor, cost: Cost = "ce") -> Tensor:
    """The guided-alignment loss of a batch, summed over the target rows that have links.

    Args:
        weights: (B, T, S) attention, row t the one used to predict target piece t; real rows sum
            to 1. For several heads, pick first (`Seq2Seq.alignment_view`).
        reference: (B, T, S) 0/1 links (`dense_reference`); rows without a link add nothing.
        cost: "ce" or "mse" (see the module docstring).

    Returns:
        A scalar in fp32 (or wider): the sum over linked rows.
    """
    if cost not in ("ce", "mse"):
        raise ValueError(f"cost must be ce or mse, got {cost!r}")
    weights = weights.to(torch.promote_types(weights.dtype, torch.float32))  # (B, T, S)
    total = reference.sum(-1, keepdim=True)  # (B, T, 1) links per target piece
    target = reference / total.clamp(min=1)  # (B, T, S) rows sum to 1 where linked
    if cost == "ce":
        per_row = -(target * weights.clamp(min=EPS).log()).sum(-1)  # (B, T)
    else:
        per_row = (weights - target).square().sum(-1)  # (B, T)
    return (per_row * (total.squeeze(-1) > 0)).sum()
