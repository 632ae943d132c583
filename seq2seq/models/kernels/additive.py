"""The additive score w_v^T tanh(W_q q + W_k k) of seq2seq.models.attention, computed for speed.

`SigmoidAdditiveScorer` is `AdditiveScorer` with the same parameters, scoring through

    tanh(x) = 2 sigmoid(2x) - 1,   so   w_v^T tanh(W_q q + W_k k_j) = 2 w_v^T sigmoid(q' + k'_j) - sum(w_v)

with q' = 2 W_q q and k'_j = 2 W_k k_j (the factors of 2 folded into the projections, the keys' once a
batch). A sigmoid costs a CPU less than a tanh, and it is the largest elementwise op of a decoder step
(why: docs/results/benchmarks.md#the-output-layer-in-chunks-and-sigmoid-energies-on-an-avx2-cpu). Beyond that:

- without gradients on a CPU (search), rows are scored a few at a time in one reused buffer
  (`scores_in_chunks`): a fresh tensor of a search step's size is mapped afresh and page-faults in;
- with gradients on long sources, `AdditiveEnergy` keeps nothing of size B x S x A for backward and
  recomputes it instead.

Its `project_keys` returns k' = 2 W_k k: the state it makes is read only by its own `forward` (and the
deferred decoder steps of seq2seq.models.kernels.decoder, which know the convention).

Dimension letters (the table in seq2seq.models.interface): B batch, S source length, H query and key
size, A attention size.
"""

import torch
import torch.nn.functional as F
from torch import Tensor

from seq2seq.models.attention import AdditiveScorer

# Elements of the (rows, S, A) energies that `scores_in_chunks` holds at once: 4 MB in fp32.
SCORE_CHUNK = 1 << 20


class SigmoidAdditiveScorer(AdditiveScorer):
    """`AdditiveScorer` through the sigmoid form, chunked without gradients on a CPU and recomputed
    in backward on long sources. Same parameters, same scores to float tolerance."""

    # Sources longer than this are scored by AdditiveEnergy, which recomputes the energies in backward
    # instead of keeping them. A token-budget batch keeps about budget x S x A floats of them over all
    # decoder steps: 100 MB at S = 24 for 2,048 tokens and A = 512, 400 MB at S = 100. Shorter
    # batches, most of them, keep them: recomputing costs an add and a sigmoid per step.
    RECOMPUTE_ABOVE = 24

    def project_keys(self, keys: Tensor) -> Tensor:
        """Args: keys (B, S, H). Returns k' = 2 W_k k, (B, S, A): doubled for `half_tanh`.

        The 2 is folded into the (A, H) weight here, once per batch, so that no decoder step multiplies
        a (B, S, A) tensor by it, forward or backward.
        """
        return F.linear(keys, 2 * self.key_proj.weight)  # (B, S, A)

    def project_query(self, query: Tensor) -> Tensor:
        """q' = 2 W_q q, doubled as the keys are: (B, H) -> (B, A)."""
        return 2 * self.query_proj(query)  # (B, A)

    def forward(self, query: Tensor, proj_keys: Tensor) -> Tensor:
        """Args: query (B, H); proj_keys (B, S, A) from `project_keys`. Returns scores (B, S)."""
        proj_query = self.project_query(query)  # (B, A)
        weight = self.energy.weight  # w_v, (1, A)
        # Compiled (seq2seq.models.kernels.compiled): the graph's own recompute and fusion instead.
        if not torch.compiler.is_compiling():
            if torch.is_grad_enabled() and proj_keys.size(1) > self.RECOMPUTE_ABOVE:
                return AdditiveEnergy.apply(proj_query, proj_keys, weight)  # (B, S)
            if not torch.is_grad_enabled() and proj_keys.device.type == "cpu":
                return scores_in_chunks(proj_query, proj_keys, weight)  # (B, S)
        gate = half_tanh(proj_query, proj_keys)  # (B, S, A)
        return 2 * self.energy(gate).squeeze(-1) - weight.sum()  # (B, S)


def half_tanh(proj_query: Tensor, proj_keys: Tensor) -> Tensor:
    """sigmoid(q' + k'_j) for every j: (B, A), (B, S, A) -> (B, S, A).

    With q' = 2 W_q s and k'_j = 2 W_k h_j this is (1 + tanh(W_q s + W_k h_j)) / 2. The factors of 2
    sit in the projections (`SigmoidAdditiveScorer.project_keys`), not here: an add with a factor gives
    the keys' gradient a (B, S, A) multiplication every step.
    """
    # In place: one (B, S, A) tensor a step instead of two (add's backward does not need its output).
    return torch.add(proj_query.unsqueeze(1), proj_keys).sigmoid_()  # (B, S, A)


def scores_in_chunks(proj_query: Tensor, proj_keys: Tensor, weight: Tensor) -> Tensor:
    """Additive scores without gradients, as `SigmoidAdditiveScorer` computes them, a few rows at a time.

    Args: proj_query (B, A) and proj_keys (B, S, A), doubled as for `half_tanh`; weight w_v (1, A).
    Returns scores (B, S).

    A search step's energies are large (B = sentences x beams: 1,500 x 20 x 512 is 60 MB), and on a
    CPU every tensor that size is mapped afresh and page-faults in. Rows are scored in one reused
    buffer of SCORE_CHUNK elements instead (why:
    docs/results/benchmarks.md#against-the-code-issue-38-was-filed-at-on-an-avx2-cpu).
    """
    B, S, A = proj_keys.shape
    dtype = torch.result_type(proj_query, proj_keys)
    rows = max(1, SCORE_CHUNK // (S * A))
    buffer = proj_keys.new_empty((min(rows, B), S, A), dtype=dtype)  # (rows, S, A)
    w = weight.reshape(-1).to(dtype)  # (A,)
    query = proj_query.unsqueeze(1)  # (B, 1, A)
    scores = proj_keys.new_empty((B, S), dtype=dtype)  # (B, S)
    for start in range(0, B, rows):
        end = min(start + rows, B)
        gate = buffer[: end - start]  # (rows, S, A)
        torch.add(query[start:end], proj_keys[start:end], out=gate).sigmoid_()
        torch.matmul(gate, w, out=scores[start:end])  # (rows, S)
    return 2 * scores - weight.sum()  # (B, S)


class AdditiveEnergy(torch.autograd.Function):
    """w_v^T tanh((q' + k'_j) / 2) for every j, keeping nothing of size B x S x A for backward.

    q' and k' are doubled as `half_tanh` takes them, so this is the additive score
    w_v^T tanh(W_q s + W_k h_j).

    Autograd would keep the (B, S, A) energies for every decoder step until backward: on long batches
    the largest part of training memory. Backward recomputes them from q' and the projected keys
    instead, which are kept anyway.
    """

    @staticmethod
    def forward(ctx, proj_query: Tensor, proj_keys: Tensor, weight: Tensor) -> Tensor:
        # proj_query (B, A), proj_keys (B, S, A), weight (1, A) -> scores (B, S)
        ctx.save_for_backward(proj_query, proj_keys, weight)
        gate = half_tanh(proj_query, proj_keys)  # (B, S, A)
        return 2 * F.linear(gate, weight).squeeze(-1) - weight.sum()  # (B, S)

    @staticmethod
    def backward(ctx, grad_scores: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        proj_query, proj_keys, weight = ctx.saved_tensors
        gate = half_tanh(proj_query, proj_keys)  # (B, S, A), recomputed
        grad = grad_scores.to(gate.dtype)  # (B, S)
        flat = gate.reshape(-1, gate.size(-1))  # (B * S, A)
        grad_weight = 2 * (grad.reshape(1, -1) @ flat) - grad.sum()  # (1, A)
        # d scores / d (q' + k') = 2 w * sigmoid'(q' + k')
        grad_gate = grad.unsqueeze(-1) * (2 * weight.to(gate.dtype))  # (B, S, A)
        grad_pre = torch.ops.aten.sigmoid_backward(grad_gate, gate)  # (B, S, A)
        return (
            grad_pre.sum(1).to(proj_query.dtype),  # (B, A)
            grad_pre.to(proj_keys.dtype),  # (B, S, A)
            grad_weight.to(weight.dtype),  # (1, A)
        )
