"""The GRU translator's decoder loops compiled (`--compile`): fewer, fused kernels a step, and on a GPU
captured as CUDA graphs.

Eager, a decoder step is a dozen small kernels (query projection, tanh, scores, masked softmax, context,
the GRU cell's two matmuls and its gates), each launched from Python, forward and backward. On a GPU
that leaves the device waiting on launches. `CompiledRNN` wraps an `RNNSeq2Seq` and runs

- teacher forcing (`decode`) in training as a few compiled calls: the decoder's `unroll` loop
  over chunks of `chunk` steps (single steps for the remainder), one graph forward and one backward;
- search (`step`) as one compiled call per step: embedding, attention, GRU cell, readout, generator.

On a GPU the graphs are also captured (`mode="reduce-overhead"`: CUDA graphs, replayed with one launch),
which needs shapes that repeat: rows and source length are padded up to `bucket` sizes and the target
length to a multiple of `chunk`. Padding changes nothing real: padded source positions are masked,
padded rows and steps are sliced off before anyone reads them, and the chunks' rows do not interact.
On the CPU nothing is padded: the graphs are compiled once with dynamic sizes.

The wrapper holds no weights; the model stays the `nn.Module` that is trained, saved and copied.
`seq2seq.models.kernels.accelerate(model, compile=True)` makes one, after plugging in the eager kernels.

Dimension letters (the table in seq2seq.models.interface): B batch, S source length, T target length,
C steps in a chunk, E embedding, H hidden, V vocabulary.
"""

import functools
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch._inductor.config
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

from seq2seq.models.interface import State
from seq2seq.models.rnn import BahdanauDecoder, RNNSeq2Seq

# State entries whose second axis is the source position (padded with masked positions).
SOURCE_AXIS = ("enc_out", "proj_keys", "src_mask")
# What teacher forcing keeps for backward: the matmuls' outputs; the rest is recomputed.
MATMULS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default}


def bucket(n: int, minimum: int = 8) -> int:
    """`n` rounded up to m * 2^k with m in 4..7, and to at least `minimum`.

    Four sizes per octave (8, 10, 12, 14, 16, 20, ...) keep the padding under 25% and the number of
    distinct shapes, each captured once, small.
    """
    n = max(n, minimum)
    step = 1 << max(n.bit_length() - 3, 0)  # three significant bits
    return -(-n // step) * step


def chunk_sizes(T: int, chunk: int) -> list[int]:
    """Steps per compiled call covering T steps: `chunk` as often as it fits, then single steps.

    For 8 and 27: [8, 8, 8, 1, 1, 1]. Two graph sizes only (each is compiled on its own); on a GPU the
    target length is padded to a multiple of `chunk`, so there are no single steps.
    """
    return [chunk] * (T // chunk) + [1] * (T % chunk)


def _pad_state(state: State, rows: int, length: int) -> State:
    """Pad every entry to `rows` rows and the source entries to `length` positions (mask False)."""
    padded = {}
    for name, value in state.items():
        pad = [0, 0] * value.dim()  # F.pad counts from the last axis
        pad[-1] = rows - value.size(0)
        if name in SOURCE_AXIS:
            pad[-3] = length - value.size(1)
        padded[name] = F.pad(value, pad)  # (rows, [length,] ...)
    return padded


def _keep_matmuls(ctx: object, op: object, *args: object, **kwargs: object) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in MATMULS else CheckpointPolicy.PREFER_RECOMPUTE


def _unroll(decoder: BahdanauDecoder, state: State, emb: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    if not torch.compiler.is_compiling():  # dynamo gave up (recompile limit): the plain loop
        return decoder.unroll(state, emb)  # (B, C, H), (B, C, H), (B, C, S)
    # Backward recomputes the elementwise work (attention energies, gates) from the matmuls' outputs;
    # left to itself the partitioner keeps tanh(W_q q + W_k k), (B, S, A), for every step. Only
    # compiled: run eagerly, this recompute is wrong, as the GRU cell's CPU kernel updates its
    # matmul outputs in place.
    context = functools.partial(create_selective_checkpoint_contexts, _keep_matmuls)
    return checkpoint(decoder.unroll, state, emb, use_reentrant=False, context_fn=context)


def _step(model: RNNSeq2Seq, state: State, prev: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    logits, weights, new_state = model.step(state, prev)  # (B, V), (B, S)
    return logits, weights, new_state["dec_state"]  # (B, H)


class Compiled(NamedTuple):
    """The compiled functions for one device type, and how they are called there."""

    unroll: Callable  # _unroll
    step: Callable  # _step
    chunk: int  # steps per compiled call in teacher forcing
    captured: bool  # replayed as CUDA graphs
    padded: bool  # shapes padded to buckets


class CompiledRNN:
    """An `RNNSeq2Seq` with compiled decoder loops. It offers the `Seq2Seq` interface (`decode` and
    `step` its own, the rest the model's), so `batch_loss` and the search functions take it as they
    take the model.

    Args:
        model: the model; its weights are used as they are (no copy), so training it trains this.
        chunk: decoder steps per compiled call in teacher forcing, a power of two (default: CHUNK for
            the device). More: fewer calls per update, longer compiles.
        cuda_graphs: capture CUDA graphs for inputs on a GPU; ignored on the CPU.
        buckets: pad shapes to buckets (default: where graphs are captured, which needs it).
    """

    # On the CPU the gain is the fusion within a step, which one step per graph keeps (why:
    # docs/results/benchmarks.md#figures-once-kept-in-the-model-code). On a GPU a call costs a launch.
    CHUNK = {"cuda": 8, "cpu": 1}

    def __init__(
        self,
        model: RNNSeq2Seq,
        chunk: int | None = None,
        cuda_graphs: bool = True,
        buckets: bool | None = None,
    ) -> None:
        if not isinstance(model, RNNSeq2Seq):
            raise TypeError(f"compiled decoding needs an RNNSeq2Seq, got {type(model).__name__}")
        if chunk is not None and (chunk < 1 or chunk & (chunk - 1)):
            raise ValueError(f"chunk must be a power of two, got {chunk}")
        self.model, self.chunk, self.cuda_graphs = model, chunk, cuda_graphs
        self.buckets = buckets
        self._compiled: dict[str, Compiled] = {}
        # Dynamo keeps one graph per chunk size, device and model size for each function,
        # and past its default limit of 8 runs eager for the rest of the process: allow more.
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)

    def __getattr__(self, name: str) -> object:
        # Everything but the decoder loops is the model's own: generator, parameters, max_len, ...
        if "model" not in self.__dict__:  # half-built (copy, pickle): nothing to delegate to yet
            raise AttributeError(name)
        return getattr(self.__dict__["model"], name)

    # Module calls that return the module return this wrapper, so `Translator(CompiledRNN(model))`,
    # which keeps `model.to(device).eval()`, keeps the compiled loops.
    def to(self, *args: object, **kwargs: object) -> "CompiledRNN":
        self.model.to(*args, **kwargs)
        return self

    def train(self, mode: bool = True) -> "CompiledRNN":
        self.model.train(mode)
        return self

    def eval(self) -> "CompiledRNN":
        return self.train(False)

    def compiled(self, device: torch.device) -> Compiled:
        """The compiled functions for `device`'s type, made on first use (compiling is lazier still:
        it happens at the first call with a new graph)."""
        kind = device.type
        if kind not in self._compiled:
            captured = kind == "cuda" and self.cuda_graphs
            triton = torch._inductor.config.triton
            if captured and triton.cudagraph_dynamic_shape_warn_limit is not None:
                # Each bucket is one recording, on purpose: 19 (rows, source) buckets in an epoch of
                # Multi30k at 2,048 tokens, past the warning's default of 8.
                limit = max(triton.cudagraph_dynamic_shape_warn_limit, 64)
                triton.cudagraph_dynamic_shape_warn_limit = limit
            # Dynamic sizes: one graph serves every batch and source length (each padded bucket is
            # still captured on its own); the chunk size, looped over, is specialised. fullgraph:
            # a graph break would run part of a chunk eagerly, which the recompute forbids.
            mode = "reduce-overhead" if captured else "default"
            compile = functools.partial(torch.compile, mode=mode, dynamic=True, fullgraph=True)
            unroll, step = compile(_unroll), compile(_step)
            chunk = self.chunk or self.CHUNK.get(kind, 1)
            padded = captured if self.buckets is None else self.buckets
            self._compiled[kind] = Compiled(unroll, step, chunk, captured, padded)
        return self._compiled[kind]

    def decode(self, state: State, tgt_in: Tensor) -> tuple[Tensor, Tensor]:
        """Teacher forcing as `RNNSeq2Seq.decode`. Args: tgt_in (B, T). Returns features (B, T, E),
        weights (B, T, S).

        Compiled for training only: without gradients (validation loss, alignments) the model's own
        loop runs, since those few batches would not repay compiling graphs of their own.
        """
        if not torch.is_grad_enabled():
            return self.model.decode(state, tgt_in)
        decoder, fn = self.model.decoder, self.compiled(tgt_in.device)
        B, T = tgt_in.shape
        S = state["enc_out"].size(1)
        emb = decoder.embed(tgt_in)  # (B, T, E): one embedding and dropout for all steps
        run, steps = state, emb
        if fn.padded:
            rows, length = bucket(B), -(-T // fn.chunk) * fn.chunk
            run = _pad_state(state, rows, bucket(S))  # (B', S', ...)
            steps = F.pad(emb, (0, 0, 0, length - T, 0, rows - B))  # (B', T', E)
        if fn.captured:  # a new training step: the graphs' buffers of the last one may be reused
            torch.compiler.cudagraph_mark_step_begin()
        outputs, start = [], 0
        for size in chunk_sizes(steps.size(1), fn.chunk):
            outputs.append(fn.unroll(decoder, run, steps[:, start : start + size]))  # (B', C, ...)
            run = {**run, "dec_state": outputs[-1][0][:, -1]}  # (B', H)
            start += size
        # Concatenating copies the outputs out of the graphs' buffers; padding is cut off here.
        states, contexts, weights = (
            torch.cat(parts, 1)[:B, :T] for parts in zip(*outputs, strict=True)
        )  # (B, T, H), (B, T, H), (B, T, S')
        features = decoder.output_features(states, contexts, emb)  # (B, T, E)
        real = tgt_in != decoder.embedding.padding_idx  # (B, T): padding steps' weights are zero
        return features, weights[..., :S] * real.unsqueeze(-1)  # (B, T, E), (B, T, S)

    def step(
        self, state: State, prev: Tensor, out: Tensor | None = None
    ) -> tuple[Tensor, Tensor, State]:
        """One search step as `RNNSeq2Seq.step`. Args: prev (B,); `out` is not used (the graph
        makes its own logits). Returns logits (B, V), weights (B, S) and the new state."""
        fn = self.compiled(prev.device)
        B, S = state["src_mask"].shape
        if not fn.padded:
            logits, weights, dec_state = fn.step(self.model, state, prev)  # (B, V), (B, S), (B, H)
            return logits, weights, {**state, "dec_state": dec_state}
        rows = bucket(B)
        run = _pad_state(state, rows, bucket(S))  # (B', S', ...)
        if fn.captured:
            torch.compiler.cudagraph_mark_step_begin()
        logits, weights, dec_state = fn.step(self.model, run, F.pad(prev, (0, rows - B)))
        parts = logits[:B], weights[:B, :S], dec_state[:B]  # (B, V), (B, S), (B, H)
        if fn.captured:  # the next replay overwrites the graph's buffers: keep copies
            parts = tuple(part.clone() for part in parts)
        return parts[0], parts[1], {**state, "dec_state": parts[2]}
