"""The GRU decoders' teacher-forced loops and the GRU translator's precision, for speed.

`DeferredBahdanauDecoder` is `BahdanauDecoder`, and `DeferredConditionalGRUDecoder` is
`ConditionalGRUDecoder`, with two changes to `forward`'s loop:

- rows in order of target length, longest first (as `seq2seq.data.batching.collate` makes them),
  stop stepping when their target ends: their s_t, c_t and alpha_t are zero from there on (only
  padding reads them);
- when a CPU computes gradients in fp32, eagerly, the steps run through
  seq2seq.models.kernels.deferred, which takes the gradients of what every step reads (each GRU
  cell's weights, the embeddings, the encoder outputs, the additive keys and w_v) once per batch
  (why: docs/results/benchmarks.md#the-decoders-steps-with-gradients-gathered-once-a-batch-on-an-avx2-cpu).
  A scorer it does not know (any but `SigmoidAdditiveScorer`) is called as the module it is.

`Fp32RecurrenceRNN` is `RNNSeq2Seq` with autocast off on a CPU around the encoder and the decoder
steps: under CPU autocast every matmul goes to oneDNN, which builds a primitive for each new shape and
keeps it, and here shapes change with every batch, so resident memory grew (why:
docs/results/benchmarks.md#figures-once-kept-in-the-model-code). Training's output layer stays in bf16.

Dimension letters (the table in seq2seq.models.interface): B batch, S source length, T target length,
E embedding, H hidden, A additive-attention size, V vocabulary.
"""

import contextlib
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seq2seq.models.attention import masked_softmax
from seq2seq.models.cgru import ConditionalGRUDecoder
from seq2seq.models.interface import State
from seq2seq.models.kernels.additive import SigmoidAdditiveScorer
from seq2seq.models.kernels.deferred import (
    Bank,
    CellStep,
    CellWeights,
    ContextStep,
    EnergyStep,
    SourceBank,
    SourceShared,
)
from seq2seq.models.rnn import BahdanauDecoder, RNNSeq2Seq

Step = Callable[[State, Tensor], tuple[Tensor, Tensor, Tensor]]


class DeferredBahdanauDecoder(BahdanauDecoder):
    """`BahdanauDecoder` whose rows stop stepping when their target ends, and whose steps gather
    their gradients once per batch when a CPU trains. Same parameters, same outputs and gradients."""

    def forward(self, state: State, tgt_in: Tensor) -> tuple[Tensor, Tensor]:
        """Teacher-forced unroll. Args: tgt_in (B, T). Returns features (B, T, E), weights (B, T, S).

        Rows in another order than longest target first step to the end. Either way the weights of
        padding steps are zero.
        """
        emb = self.embed(tgt_in)  # (B, T, E)
        real = tgt_in != self.embedding.padding_idx  # (B, T)
        lengths = real.sum(1)  # (B,) steps each row decodes
        rows = None
        if bool((lengths[:-1] >= lengths[1:]).all()):
            rows = real.sum(0).tolist()  # per step, the rows still decoding: a prefix
        states, contexts, weights = self.unroll(state, emb, rows)  # (B, T, H), (B, T, H), (B, T, S)
        features = self.output_features(states, contexts, emb)  # (B, T, E)
        return features, weights * real.unsqueeze(-1)  # (B, T, E), (B, T, S)

    def unroll(
        self, state: State, emb: Tensor, rows: list[int] | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """`BahdanauDecoder.unroll`, with rows: for each step, how many leading rows still decode,
        non-increasing; the others have ended, and their s_t, c_t and alpha_t are zero. None: every
        row, every step (as seq2seq.models.kernels.compiled calls it)."""
        B, T = emb.shape[:2]
        states, contexts, weights = [], [], []
        run = state
        rows = [B] * T if rows is None else rows
        if steps_deferred(emb):
            step, inputs = self.deferred_steps(state, emb, rows)  # (rows[t], 3H) each
        else:  # (B, E) each: one backward node, not one a step
            step, inputs = self.attend_and_update, emb.unbind(1)
        for n, input_t in zip(rows, inputs, strict=True):
            if n < run["dec_state"].size(0):  # sliced when rows end, not every step: views
                run = {name: value[:n] for name, value in run.items()}  # (n, ...)
            # (n, H), (n, H), (n, S)
            dec_state, context, alpha = step(run, input_t[:n])
            run = {**run, "dec_state": dec_state}
            for outputs, value in ((states, dec_state), (contexts, context), (weights, alpha)):
                outputs.append(F.pad(value, (0, 0, 0, B - n)) if n < B else value)  # (B, ...)
        return torch.stack(states, 1), torch.stack(contexts, 1), torch.stack(weights, 1)

    def deferred_steps(
        self, state: State, emb: Tensor, rows: list[int]
    ) -> tuple[Step, list[Tensor]]:
        """`attend_and_update` for training on a CPU, with gradients gathered over the steps.

        state: the batch's, before its first step; emb (B, T, E); rows: per step, the rows still
        decoding. Returns the step and, for each step, what it takes in place of the embedding: its
        rows of W_ie y + b_ih (rows[t], 3H), the embeddings' share of the cell's input gates, computed
        for all steps in one matmul. The step computes what `attend_and_update` does through
        seq2seq.models.kernels.deferred.
        """
        update, embedded = deferred_cell(self.cell, emb, rows, emb.size(0))  # (M, 3H)
        attend = deferred_attention(self.scorer, state, len(rows))

        def step(run: State, embedded: Tensor) -> tuple[Tensor, Tensor, Tensor]:
            prev = run["dec_state"]  # s_{t-1}, (B', H)
            context, alpha = attend(prev, run)  # (B', H), (B', S)
            return update(embedded, context, prev), context, alpha

        return step, list(embedded.split(rows))


class DeferredConditionalGRUDecoder(DeferredBahdanauDecoder, ConditionalGRUDecoder):
    """`ConditionalGRUDecoder` whose rows stop stepping when their target ends, and whose steps
    gather their gradients once per batch when a CPU trains: GRU1, GRU2, the attention. Same
    parameters, same outputs and gradients; off a CPU's training, its own `attend_and_update`."""

    def deferred_steps(
        self, state: State, emb: Tensor, rows: list[int]
    ) -> tuple[Step, list[Tensor]]:
        """`ConditionalGRUDecoder.attend_and_update` for training on a CPU, as
        `DeferredBahdanauDecoder.deferred_steps` is Bahdanau's: what each step takes in place of
        the embedding is its rows of GRU1's W_ie y + b_ih (rows[t], 3H)."""
        B = emb.size(0)
        query_update, query_gates = deferred_cell(self.query_cell, emb, rows, B)  # GRU1, (M, 3H)
        state_update, biases = deferred_cell(self.cell, None, rows, B)  # GRU2: b_ih, (M, 3H)
        attend = deferred_attention(self.scorer, state, len(rows))

        def step(run: State, gates: Tensor) -> tuple[Tensor, Tensor, Tensor]:
            query = query_update(gates, None, run["dec_state"])  # s'_t = GRU1(E y_{t-1}, s_{t-1})
            context, alpha = attend(query, run)  # (B', H), (B', S)
            dec_state = state_update(biases[: gates.size(0)], context, query)  # GRU2(c_t, s'_t)
            return dec_state, context, alpha

        return step, list(query_gates.split(rows))


def deferred_cell(
    cell: nn.GRUCell, emb: Tensor | None, rows: list[int], batch: int
) -> tuple[Callable[[Tensor, Tensor | None, Tensor], Tensor], Tensor]:
    """A cell's steps over one batch, their weights' gradients gathered (seq2seq.models.kernels.deferred).

    emb (B, T, E): the part of the cell's input known before the first step (E y_{t-1}), or None
    when the whole input comes from the step. Returns `update(known, late, prev) -> s` and the input
    gates' known share, W_ie y + b_ih (or b_ih), for every step's rows (M, 3H): `update` takes the
    step's rows of that share as `known`, the rest of the input as `late` (or None) and s_{t-1}.
    """
    bank = Bank(rows, batch, cell, cell.weight_ih, 0 if emb is None else emb.size(-1))
    known, *weights = CellWeights.apply(
        bank, emb, cell.weight_ih, cell.bias_ih, cell.weight_hh, cell.bias_hh
    )  # (M, 3H), then w_ih, w_hh, b_hh

    def update(known: Tensor, late: Tensor | None, prev: Tensor) -> Tensor:
        return CellStep.apply(known, late, prev, *weights, bank)  # (B', H)

    return update, known


def deferred_attention(
    scorer: nn.Module, state: State, steps: int
) -> Callable[[Tensor, State], tuple[Tensor, Tensor]]:
    """The attention of `steps` steps over one batch, the encoder outputs' gradient (and the sigmoid
    additive scorer's keys' and w_v's) gathered. Returns `attend(query, run) -> (c, alpha)`: query
    (B', H) and the step's `run` state, c (B', H) and alpha (B', S). Any scorer but
    `SigmoidAdditiveScorer` is called as the module it is."""
    additive = isinstance(scorer, SigmoidAdditiveScorer)
    keys = state["proj_keys"] if additive else None  # (B, S, A)
    source_bank = SourceBank(state["enc_out"], steps, keys)
    source = [state["enc_out"]] + ([keys, scorer.energy.weight] if additive else [])
    enc_out, *energy = SourceShared.apply(source_bank, *source)

    def attend(query: Tensor, run: State) -> tuple[Tensor, Tensor]:
        if additive:
            projected = scorer.project_query(query)  # (B', A)
            limit = scorer.RECOMPUTE_ABOVE
            scores = EnergyStep.apply(projected, *energy, source_bank, limit)  # (B', S)
        else:
            scores = scorer(query, run["proj_keys"])  # (B', S)
        alpha = masked_softmax(scores, run["src_mask"])  # (B', S)
        return ContextStep.apply(alpha, enc_out, source_bank), alpha  # (B', H), (B', S)

    return attend


def steps_deferred(like: Tensor) -> bool:
    """Whether teacher forcing steps through seq2seq.models.kernels.deferred: when a CPU computes
    gradients in fp32 (autocast off, as `Fp32RecurrenceRNN` leaves it), eagerly. GPUs, and compiled
    code, keep the modules (`attend_and_update`)."""
    return (
        like.device.type == "cpu"
        and torch.is_grad_enabled()
        and not torch.is_autocast_enabled("cpu")
        and not torch.compiler.is_compiling()
    )


def fp32_on_cpu(like: Tensor) -> contextlib.AbstractContextManager:
    """Autocast off on a CPU: the recurrent parts run in fp32 there, under bf16-mixed too."""
    on_cpu = like.device.type == "cpu" and torch.is_autocast_enabled("cpu")
    return torch.autocast("cpu", enabled=False) if on_cpu else contextlib.nullcontext()


class Fp32RecurrenceRNN(RNNSeq2Seq):
    """`RNNSeq2Seq` whose encoder and decoder steps leave CPU autocast (`fp32_on_cpu`)."""

    def encode(self, src: Tensor, src_lens: Tensor, src_mask: Tensor) -> State:
        with fp32_on_cpu(src):
            return super().encode(src, src_lens, src_mask)

    def decode(self, state: State, tgt_in: Tensor) -> tuple[Tensor, Tensor]:
        with fp32_on_cpu(tgt_in):
            return super().decode(state, tgt_in)

    def step(
        self, state: State, prev: Tensor, out: Tensor | None = None
    ) -> tuple[Tensor, Tensor, State]:
        with fp32_on_cpu(prev):
            return super().step(state, prev, out)
