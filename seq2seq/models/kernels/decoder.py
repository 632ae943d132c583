"""The Bahdanau decoder's teacher-forced loop and the GRU translator's precision, for speed.

`DeferredBahdanauDecoder` is `BahdanauDecoder` with two changes to `forward`'s loop:

- rows in order of target length, longest first (as `seq2seq.data.batching.collate` makes them),
  stop stepping when their target ends: their s_t, c_t and alpha_t are zero from there on (only
  padding reads them);
- when a CPU computes gradients in fp32, eagerly, the steps run through
  seq2seq.models.kernels.deferred, which takes the gradients of what every step reads (the GRU
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
from torch import Tensor

from seq2seq.models.attention import masked_softmax
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
        cell, scorer = self.cell, self.scorer
        cell_bank = Bank(rows, emb.size(0), cell, cell.weight_ih)
        embedded, *weights = CellWeights.apply(
            cell_bank, emb, cell.weight_ih, cell.bias_ih, cell.weight_hh, cell.bias_hh
        )  # (M, 3H), then w_ih, w_hh, b_hh
        # The sigmoid additive scorer's keys and w_v are gathered too; any other scorer runs as it is.
        additive = isinstance(scorer, SigmoidAdditiveScorer)
        keys = state["proj_keys"] if additive else None  # (B, S, A)
        source_bank = SourceBank(state["enc_out"], len(rows), keys)
        source = [state["enc_out"]] + ([keys, scorer.energy.weight] if additive else [])
        enc_out, *energy = SourceShared.apply(source_bank, *source)

        def step(run: State, embedded: Tensor) -> tuple[Tensor, Tensor, Tensor]:
            prev = run["dec_state"]  # s_{t-1}, (B', H)
            if additive:
                query = scorer.project_query(prev)  # (B', A)
                limit = scorer.RECOMPUTE_ABOVE
                scores = EnergyStep.apply(query, *energy, source_bank, limit)  # (B', S)
            else:
                scores = scorer(prev, run["proj_keys"])  # (B', S)
            alpha = masked_softmax(scores, run["src_mask"])  # (B', S)
            context = ContextStep.apply(alpha, enc_out, source_bank)  # (B', H)
            return CellStep.apply(embedded, context, prev, *weights, cell_bank), context, alpha

        return step, list(embedded.split(rows))


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
