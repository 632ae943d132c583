"""The training loss: label-smoothed cross-entropy over the real target tokens of a batch.

    loss = sum_t (1 - eps) * -log p(y_t) + eps * mean_v(-log p(v))          (Szegedy et al., 2016)

The NLL (eps = 0) comes out of the same pass: it is what perplexity reports.
"""

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from seq2seq.models.interface import Seq2Seq

# The output layer works through a batch's rows this many logits at a time (16 MB in fp32): a
# (N, V) tensor, 61 MB for 1,920 tokens and V = 8,000, is never made. glibc hands every allocation
# over 32 MB straight to the kernel and takes it back on free, so each one page-faults in afresh,
# four of them an update (logits, log-probabilities, their gradient, a copy). Chunks that size are
# reused from the heap instead (measured:
# docs/results/benchmarks.md#the-output-layer-in-chunks-and-sigmoid-energies-on-an-avx2-cpu).
CHUNK_LOGITS = 1 << 22
# Each chunk's row count is rounded up to a multiple of ROWS with zero rows that get no loss. Under
# bf16 autocast on a CPU every new shape of a matmul is a oneDNN primitive whose memory is not given
# back (see seq2seq.models.kernels.decoder.Fp32RecurrenceRNN for the rest of the story); this way
# at most rows_per_chunk / ROWS shapes occur.
ROWS = 64
# The chunks' buffers, kept from one call to the next by (name, columns, dtype, device): each new
# buffer would be fresh pages, a page fault apiece on first write, every update (measured:
# docs/results/benchmarks.md#the-output-losss-buffers-kept-and-a-bf16-decoder-cell-tried-on-an-avx512-bf16-cpu). Under autocast that is four of them: the logits in bf16 and in fp32, the weight
# cast and its gradient's bf16 product.
_KEPT: dict[tuple, Tensor] = {}


def kept(name: str, rows: int, cols: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """A (rows, cols) buffer, uninitialised, that later calls with the same name reuse."""
    key = (name, cols, dtype, device)
    buffer = _KEPT.get(key)
    if buffer is None or buffer.size(0) < rows:
        buffer = _KEPT[key] = torch.empty(rows, cols, dtype=dtype, device=device)
    return buffer[:rows]


def rows_per_chunk(vocab: int) -> int:
    """Rows of the output layer per chunk: CHUNK_LOGITS / vocab, a multiple of ROWS (at least ROWS)."""
    return max(ROWS, CHUNK_LOGITS // vocab // ROWS * ROWS)


def output_loss(
    rows: Tensor, weight: Tensor, bias: Tensor | None, target: Tensor, smoothing: float
) -> tuple[Tensor, Tensor]:
    """The output layer and the label-smoothed cross-entropy in one pass, both losses summed.

    Args: rows (N, O) the features of the real target positions; weight (V, O) and bias (V,) the
    output layer's; target (N,) ids. Returns the smoothed loss (differentiable) and the plain NLL (a
    figure to report: perplexity), in fp32 or wider.
    """
    need = (rows, weight) if bias is None else (rows, weight, bias)
    grads = torch.is_grad_enabled() and any(t.requires_grad for t in need)
    return OutputLoss.apply(rows, weight, bias, target, smoothing, grads)


class OutputLoss(torch.autograd.Function):
    """`output_loss`: logits, loss and gradients chunk by chunk, in the forward pass.

    The loss is the last thing an update computes, so its gradients with respect to the rows, the
    weight and the bias are known in forward, up to the one scalar backward brings. Each chunk's
    logits become, in place, their own gradient, softmax - (1 - eps) onehot - eps / V, which two
    matmuls carry to the rows and the weight before the next chunk's logits take their place. Autograd
    would keep the (N, V) logits and log-probabilities from forward to backward and make (N, V)
    gradients from them there; this keeps the (N, O) and (V, O) gradients instead.
    """

    @staticmethod
    def forward(ctx, rows, weight, bias, target, smoothing, grads):
        # rows (N, O), weight (V, O), bias (V,) or None, target (N,)
        device, vocab, eps = rows.device.type, weight.size(0), smoothing
        where = rows.device
        autocast = torch.is_autocast_enabled(device)
        dtype = torch.get_autocast_dtype(device) if autocast else rows.dtype  # the matmuls'
        wide = torch.promote_types(
            dtype, torch.float32
        )  # the softmax's: fp32 (float64 in gradcheck)
        loss = nll = torch.zeros((), dtype=wide, device=rows.device)
        with torch.autocast(device, enabled=False):
            w = weight  # (V, O) cast once, not once a chunk
            if dtype != weight.dtype:
                w = kept("weight", *weight.shape, dtype, where).copy_(weight)
            b = None if bias is None else bias.to(dtype)  # (V,)
            if grads:
                grad_rows = torch.empty(rows.shape, dtype=wide, device=rows.device)  # (N, O)
                grad_w = torch.zeros(weight.shape, dtype=wide, device=rows.device)  # (V, O)
                grad_b = torch.zeros(vocab, dtype=wide, device=rows.device)  # (V,)
            size = rows_per_chunk(vocab)
            # One (C', V) buffer for every chunk's logits, and under autocast one for the softmax's
            # wide copy of them.
            chunk = min(size, -(-len(rows) // ROWS) * ROWS)
            buffer = kept("logits", chunk, vocab, dtype, where)  # (C', V)
            widened = buffer if dtype == wide else kept("wide", chunk, vocab, wide, where)
            for start in range(0, len(rows), size):
                tgt = target[start : start + size]  # (C,)
                n = len(tgt)
                part = F.pad(rows[start : start + n].to(dtype), (0, 0, 0, -n % ROWS))  # (C', O)
                full = buffer[: len(part)]  # (C', V)
                if b is None:
                    torch.mm(part, w.t(), out=full)
                else:
                    torch.addmm(b, part, w.t(), out=full)
                logits = widened[:n]  # (C, V): `full` itself unless autocast narrowed it
                if widened is not buffer:
                    logits.copy_(full[:n])
                picked = logits.gather(1, tgt.unsqueeze(1)).squeeze(1)  # (C,)
                mean = logits.mean(-1)  # (C,)
                top = logits.amax(-1, keepdim=True)  # (C, 1)
                exp = logits.sub_(top).exp_()  # (C, V) in place: exp(logit - top)
                total = exp.sum(-1, keepdim=True)  # (C, 1)
                lse = (top + total.log()).squeeze(1)  # (C,) log-sum-exp of the logits
                token_nll = lse - picked  # (C,)
                uniform = lse - mean  # (C,) cross-entropy against the uniform distribution
                loss = loss + ((1.0 - eps) * token_nll + eps * uniform).sum()
                nll = nll + token_nll.sum()
                if not grads:
                    continue
                grad = exp.div_(total).sub_(eps / vocab)  # (C, V) in place: softmax - eps / V
                grad[torch.arange(n, device=grad.device), tgt] -= 1.0 - eps
                grad_b += grad.sum(0)  # (V,)
                if grad.dtype != dtype:  # autocast: back to the matmuls' dtype, in `full`
                    full[:n] = grad
                full[n:] = 0  # (C', V): padding rows get no gradient
                grad_rows[start : start + n] = (full @ w)[:n]  # (C, O)
                if dtype == wide:  # accumulated by the matmul itself: no (V, O) temporary, no add
                    torch.addmm(grad_w, full.t(), part, out=grad_w)  # (V, O)
                else:  # the bf16 product, summed in fp32
                    product = torch.mm(full.t(), part, out=kept("product", *w.shape, dtype, where))
                    grad_w += kept("wide product", *w.shape, wide, where).copy_(product)  # (V, O)
        if grads:
            ctx.save_for_backward(grad_rows, grad_w, grad_b)
        ctx.dtypes = rows.dtype, weight.dtype, None if bias is None else bias.dtype
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss, grad_nll):
        scaled = [g * grad_loss for g in ctx.saved_tensors]  # (N, O), (V, O), (V,)
        rows, weight, bias = (
            g.to(d) if d else None for g, d in zip(scaled, ctx.dtypes, strict=True)
        )
        return rows, weight, bias, None, None, None


def batch_loss(
    model: Seq2Seq, batch: dict[str, Tensor], label_smoothing: float
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Teacher-forced loss of a batch: smoothed loss sum, NLL sum, real token count, attention weights.

    The output layer runs on the real target positions only (`output_loss`).
    """
    state = model.encode(batch["src"], batch["src_lens"], batch["src_mask"])
    features, weights = model.decode(state, batch["tgt_in"])  # (B, T, O), (B, T, [N,] S)
    mask = batch["tgt_mask"]  # (B, T)
    rows = features[mask]  # (N_tok, O)
    out, target = model.generator, batch["tgt_out"][mask]  # (V, O) layer, (N_tok,)
    loss_sum, nll_sum = output_loss(rows, out.weight, out.bias, target, label_smoothing)
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
