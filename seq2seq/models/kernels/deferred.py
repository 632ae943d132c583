"""The GRU decoders' steps for training on a CPU, with the gradients of what every step reads
taken once per batch.

Autograd computes the gradient of a tensor at every step that reads it, and adds it into the sum:
- a GRU cell's W_ih and W_hh: two (3H, rows) x (rows, in) matmuls a step, and around them the
  gates as a dozen small nodes whose backward splits and concatenates (rows, 3H) gradients;
- the encoder outputs, through the context c = alpha^T h: a (rows, S, H) outer product a step;
- the additive scorer's keys and w_v: (rows, S, A) gradients made and added a step.
Here a step's cell is one node, `CellStep`, whose backward writes the gates' gradients into the
cell's `Bank` beside the step's inputs; `CellWeights`' backward, which autograd runs after every
step's, takes each weight's gradient in one (3H, steps x rows) x (steps x rows, in) matmul, and the
embeddings' in one (steps x rows, 3H) x (3H, E). The embeddings are known before the first step, so
their share of the input gates, W_ie y + b_ih, is one matmul over all steps too. A decoder with two
cells (the conditional GRU's GRU1, which reads E y_{t-1}, and GRU2, which reads c_t alone) gives
each its own bank.
`ContextStep` keeps each step's alpha and dc in a `SourceBank`, and `SourceShared`'s backward takes
the encoder outputs' gradient as one (B, S, T) x (B, T, H) matmul; `EnergyStep` adds its share of
the keys' gradient into one (B, S, A) sum in place, and folds the factor w_v, equal for every step,
in once. The arithmetic is the modules'; tests/unit/models/kernels/test_kernels_rnn.py checks outputs and every gradient
against them (why:
docs/results/benchmarks.md#the-decoders-steps-with-gradients-gathered-once-a-batch-on-an-avx2-cpu).
The decoders that use them are seq2seq.models.kernels.decoder's; Bahdanau's step:

    cell_bank = Bank(rows_per_step, batch, cell, like, ahead=E)
    embedded, *weights = CellWeights.apply(cell_bank, emb, w_ih, b_ih, w_hh, b_hh)   # once per batch
    source_bank = SourceBank(enc_out, steps, proj_keys)
    enc_out, proj_keys, w_v = SourceShared.apply(source_bank, enc_out, proj_keys, w_v)
    scores = EnergyStep.apply(2 W_q s, proj_keys, w_v, source_bank, recompute_above)   # every step
    context = ContextStep.apply(alpha, enc_out, source_bank)
    s_t = CellStep.apply(embedded[rows of step t], context, s, *weights, cell_bank)
"""

import torch
from torch import Tensor, nn


class Bank:
    """A batch's step inputs and gate gradients, each step's rows at their own offset.

    A GRU cell's input x is in two parts: the first `ahead` columns are known before the first step
    (the embedding E y_{t-1}: E; or nothing: 0), the rest only when the step runs (the context c_t,
    or nothing). inputs (M, in): x of each step; states (M, H): the state it updates; grad_ih,
    grad_hh (M, 3H): the gradients of W_ih x + b_ih and W_hh s + b_hh. M is the rows of all steps
    together: step t's rows[t] (a prefix of the batch) after those of the steps before. index (M,):
    each row's place in the batch's (B T) positions, b T + t.
    """

    def __init__(
        self, rows: list[int], batch: int, cell: nn.GRUCell, like: Tensor, ahead: int
    ) -> None:
        H, M = cell.hidden_size, sum(rows)
        self.batch, self.steps, self.ahead = batch, len(rows), ahead
        self.inputs = like.new_empty(M, cell.input_size)  # (M, in)
        self.states = like.new_empty(M, H)  # (M, H)
        self.grad_ih = like.new_empty(M, 3 * H)  # (M, 3H)
        self.grad_hh = like.new_empty(M, 3 * H)  # (M, 3H)
        counts = torch.tensor(rows)  # (T,)
        starts = counts.cumsum(0) - counts  # (T,) each step's first row
        firsts = starts.repeat_interleave(counts)  # (M,) each row's step's first row
        steps = torch.arange(len(rows)).repeat_interleave(counts)  # (M,)
        self.index = (torch.arange(M) - firsts) * len(rows) + steps  # (M,)
        self.used = 0  # rows handed out to steps so far
        # Rows whose gradients backward has written: the steps up to the last one that reaches the
        # loss (a step's backward gives its s_{t-1} a gradient, so the earlier steps' run too).
        self.written = 0

    def take(self, rows: int) -> slice:
        """The next step's rows."""
        if self.used + rows > self.inputs.size(0):
            raise RuntimeError(f"bank of {self.inputs.size(0)} rows asked for {self.used + rows}")
        start, self.used = self.used, self.used + rows
        return slice(start, self.used)


class CellWeights(torch.autograd.Function):
    """The known share of every step's input gates, W_ie y + b_ih, in one matmul, and the cell's
    weights as the steps see them; backward gives the embeddings' and the weights' gradients over
    all steps.

    Args: emb (B, T, E) of y_0..y_{T-1}, or None for a cell whose input is all the step's (the bank's
    `ahead` 0: the gates' known share is b_ih alone); w_ih (3H, in), b_ih, w_hh, b_hh. Returns the
    known share in the bank's rows (M, 3H), which has no gradient of its own, then w_ih, w_hh and b_hh.
    """

    @staticmethod
    def forward(ctx, bank: Bank, emb: Tensor | None, w_ih, b_ih, w_hh, b_hh) -> tuple[Tensor, ...]:  # noqa: PLR0913
        E, M = bank.ahead, bank.inputs.size(0)
        if E:
            embs = bank.inputs[:, :E]  # (M, E)
            embs.copy_(emb.reshape(-1, E)[bank.index])  # each step's rows of emb
            gates = torch.addmm(b_ih, embs, w_ih[:, :E].t())  # (M, 3H)
        else:
            gates = b_ih.expand(M, -1)  # (M, 3H): a view, every row b_ih
        ctx.mark_non_differentiable(gates)
        ctx.set_materialize_grads(False)  # the steps give these outputs no gradient
        ctx.save_for_backward(w_ih)
        ctx.bank = bank
        return gates, w_ih.view_as(w_ih), w_hh.view_as(w_hh), b_hh.view_as(b_hh)

    @staticmethod
    def backward(ctx, *_unused: Tensor | None) -> tuple[Tensor | None, ...]:
        bank, used = ctx.bank, ctx.bank.written
        if not used:  # no step reached the loss
            return None, None, None, None, None, None
        (w_ih,) = ctx.saved_tensors  # (3H, in)
        B, T, E = bank.batch, bank.steps, bank.ahead
        grad_ih, grad_hh = bank.grad_ih[:used], bank.grad_hh[:used]  # (M, 3H)
        grad_emb = None
        if E:
            grad_emb = grad_ih.new_zeros(B * T, E)  # (B T, E): zero where no step reached the loss
            grad_emb.index_copy_(0, bank.index[:used], grad_ih @ w_ih[:, :E])
            grad_emb = grad_emb.view(B, T, E)
        return (
            None,
            grad_emb,
            grad_ih.t() @ bank.inputs[:used],  # W_ih (3H, in)
            grad_ih.sum(0),  # b_ih (3H,)
            grad_hh.t() @ bank.states[:used],  # W_hh (3H, H)
            grad_hh.sum(0),  # b_hh (3H,)
        )


class CellStep(torch.autograd.Function):
    """nn.GRUCell's s_t from x = [known; late] and s_{t-1}, the weights from `CellWeights`.

    r = sigmoid(W_ir x + b_ir + W_hr s + b_hr), z likewise, n = tanh(W_in x + b_in + r (W_hn s + b_hn)),
    s_t = n + z (s - n). Args: known (B, 3H), the step's rows of `CellWeights`' first output; late
    (B, in - ahead), the input's part the step computed (the context), or None when it has none;
    prev (B, H). Returns s_t (B, H).
    """

    @staticmethod
    def forward(ctx, known, late, prev, w_ih, w_hh, b_hh, bank: Bank) -> Tensor:  # noqa: PLR0913
        rows, E = bank.take(prev.size(0)), bank.ahead
        bank.states[rows] = prev
        if late is None:
            gi = known.clone()  # (B, 3H): changed in place below
        else:
            bank.inputs[rows, E:] = late
            gi = torch.addmm(known, late, w_ih[:, E:].t())  # (B, 3H)
        gh = torch.addmm(b_hh, prev, w_hh.t())  # (B, 3H)
        i_r, i_z, i_n = gi.chunk(3, 1)
        h_r, h_z, h_n = gh.chunk(3, 1)
        r = i_r.add_(h_r).sigmoid_()  # (B, H)
        z = i_z.add_(h_z).sigmoid_()  # (B, H)
        n = torch.addcmul(i_n, r, h_n).tanh_()  # (B, H)
        ctx.save_for_backward(prev, r, z, n, h_n, w_ih, w_hh)
        ctx.bank, ctx.rows, ctx.late = bank, rows, late is not None
        return torch.addcmul(n, z, prev - n)  # (B, H)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:
        prev, r, z, n, h_n, w_ih, w_hh = ctx.saved_tensors
        H, bank = prev.size(1), ctx.bank
        bank.written = max(bank.written, ctx.rows.stop)
        grad_ih = bank.grad_ih[ctx.rows]  # (B, 3H), written here
        grad_hh = bank.grad_hh[ctx.rows]  # (B, 3H)
        d_r, d_z, d_n = grad_ih.split(H, 1)  # (B, H) views
        # n: ds/dn = 1 - z, through tanh: 1 - n^2
        torch.mul(grad, 1 - z, out=d_n).mul_(1 - n * n)
        # z: ds/dz = s - n, through sigmoid: z (1 - z)
        torch.mul(grad, prev - n, out=d_z).mul_(z * (1 - z))
        # r: dn_pre/dr = W_hn s + b_hn, through sigmoid: r (1 - r)
        torch.mul(d_n, h_n, out=d_r).mul_(r * (1 - r))
        grad_hh[:, : 2 * H] = grad_ih[:, : 2 * H]  # r and z enter both sums alike
        torch.mul(d_n, r, out=grad_hh[:, 2 * H :])  # n: r (W_hn s + b_hn)
        # The late input's (B, in - ahead); the known part's is taken in CellWeights.
        grad_late = grad_ih @ w_ih[:, bank.ahead :] if ctx.late else None
        grad_prev = torch.addmm(grad * z, grad_hh, w_hh)  # (B, H): direct and through W_hh
        return None, grad_late, grad_prev, None, None, None, None


class SourceBank:
    """A batch's source-side gradients, gathered over the steps and finished once.

    alphas (B, T, S) and grad_contexts (B, T, H): each step's attention weights and its context's
    gradient, zero for rows that have ended, so the encoder outputs' gradient is one (B, S, T) x
    (B, T, H) matmul. With the additive scorer, grad_keys (B, S, A) sums g_j sigmoid'(q + k_j) over
    the steps (the factor 2 w_v, equal for every step, is applied once), grad_w (A,) the energy
    weight's sum, grad_sum the scores' gradients summed.
    """

    def __init__(self, enc_out: Tensor, steps: int, keys: Tensor | None) -> None:
        B, S, H = enc_out.shape
        self.alphas = enc_out.new_zeros(B, steps, S)  # (B, T, S)
        self.grad_contexts = enc_out.new_zeros(B, steps, H)  # (B, T, H)
        self.step = 0  # the next step's index
        if keys is not None:
            self.grad_keys = torch.zeros_like(keys)  # (B, S, A)
            self.grad_w = keys.new_zeros(keys.size(-1))  # (A,)
            self.grad_sum = keys.new_zeros(())


class SourceShared(torch.autograd.Function):
    """enc_out (B, S, H), and for the additive scorer proj_keys (B, S, A) and w_v (1, A), as the
    steps see them; backward gives their gradients over all steps."""

    @staticmethod
    def forward(ctx, bank: SourceBank, *tensors: Tensor) -> tuple[Tensor, ...]:
        ctx.bank = bank
        ctx.set_materialize_grads(False)  # the steps give these outputs no gradient
        if len(tensors) > 1:
            ctx.save_for_backward(tensors[2])  # w_v
        return tuple(t.view_as(t) for t in tensors)

    @staticmethod
    def backward(ctx, *_unused: Tensor | None) -> tuple[Tensor | None, ...]:
        bank = ctx.bank
        T = bank.step
        # sum_t alpha_t^T dc_t for every row: (B, S, T) x (B, T, H)
        grad_enc = torch.bmm(bank.alphas[:, :T].transpose(1, 2), bank.grad_contexts[:, :T])
        if not ctx.saved_tensors:
            return None, grad_enc
        (w,) = ctx.saved_tensors  # (1, A)
        grad_keys = bank.grad_keys.mul_(2 * w)  # (B, S, A)
        grad_w = (2 * bank.grad_w - bank.grad_sum).unsqueeze(0)  # (1, A)
        return None, grad_enc, grad_keys, grad_w


class EnergyStep(torch.autograd.Function):
    """The additive scores w_v^T tanh(W_q s + W_k h_j) of one step, as `SigmoidAdditiveScorer` scores them.

    Args: proj_query (B', A) = 2 W_q s and proj_keys (B, S, A) = 2 W_k h from `SourceShared`, of which
    the first B' rows are scored; w_v (1, A). Returns scores (B', S). Backward returns the query's
    gradient and adds the keys' and w_v's into the bank. Sources longer than `recompute_above` keep
    only q and recompute sigmoid(q + k) in backward, as `seq2seq.models.kernels.additive.AdditiveEnergy` does.
    """

    @staticmethod
    def forward(
        ctx, proj_query, proj_keys, weight, bank: SourceBank, recompute_above: int
    ) -> Tensor:  # noqa: PLR0913
        keys = proj_keys[: proj_query.size(0)]  # (B', S, A)
        gate = torch.add(proj_query.unsqueeze(1), keys).sigmoid_()  # (B', S, A)
        ctx.recompute = keys.size(1) > recompute_above
        ctx.save_for_backward(proj_query, proj_keys, weight, None if ctx.recompute else gate)
        ctx.bank = bank
        return 2 * torch.matmul(gate, weight.squeeze(0)) - weight.sum()  # (B', S)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:
        proj_query, proj_keys, weight, gate = ctx.saved_tensors
        n, bank = proj_query.size(0), ctx.bank
        keys = proj_keys[:n]  # (B', S, A)
        if ctx.recompute:
            gate = torch.add(proj_query.unsqueeze(1), keys).sigmoid_()  # (B', S, A)
        flat = gate.view(-1, gate.size(-1))  # (B' S, A)
        bank.grad_w.addmv_(flat.t(), grad.reshape(-1))  # sum_j g_j sigmoid(q + k_j)
        bank.grad_sum += grad.sum()
        slope = torch.addcmul(gate, gate, gate, value=-1, out=gate)  # sigmoid' = s - s^2, in place
        bank.grad_keys[:n].addcmul_(slope, grad.unsqueeze(-1))  # (B', S, A)
        grad_query = torch.bmm(grad.unsqueeze(1), slope).squeeze(1) * (2 * weight)  # (B', A)
        return grad_query, None, None, None, None


class ContextStep(torch.autograd.Function):
    """c = sum_j alpha_j h_j for one step over the first B' rows of enc_out (from `SourceShared`).

    Args: alpha (B', S), enc_out (B, S, H). Returns (B', H). Backward returns alpha's gradient and
    leaves alpha and dc in the bank for the encoder outputs'.
    """

    @staticmethod
    def forward(ctx, alpha: Tensor, enc_out: Tensor, bank: SourceBank) -> Tensor:
        n, t = alpha.size(0), bank.step
        bank.step += 1
        values = enc_out[:n]  # (B', S, H)
        bank.alphas[:n, t] = alpha
        ctx.save_for_backward(values)
        ctx.bank, ctx.t = bank, t
        return torch.bmm(alpha.unsqueeze(1), values).squeeze(1)  # (B', H)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, None, None]:
        (values,) = ctx.saved_tensors  # (B', S, H)
        ctx.bank.grad_contexts[: grad.size(0), ctx.t] = grad
        return torch.bmm(values, grad.unsqueeze(-1)).squeeze(-1), None, None  # (B', S)
