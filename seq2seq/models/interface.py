"""The interface every translation model offers, which search, the loss and the system rely on.

A model is encoded once per batch, then decoded either teacher-forced (training, `decode`) or one step at
a time (search, `step`). The decoder's state is a flat dict of batch-first tensors, so reordering it for
beam search is one `index_select` per entry, whatever the model keeps there (projected keys, a GRU
state, cached keys and values).

Dimension letters, the same in every module of the package:

| letter | meaning                                                        |
|--------|----------------------------------------------------------------|
| B      | batch (sentences)                                              |
| S, T   | source length, target length (subwords)                        |
| E      | embedding size                                                 |
| H      | hidden size: GRU state, encoder output, Transformer d_model    |
| A      | additive-attention size                                        |
| N, D   | attention heads, head size D = H / N                           |
| F      | Transformer feed-forward size                                  |
| O      | output-feature size (what the generator reads)                 |
| V      | vocabulary                                                     |
| K      | beam size                                                      |
| R      | sentences still open in beam search                            |
| L      | layers                                                         |
"""

import torch
from torch import Tensor, nn

State = dict[str, Tensor]


class Seq2Seq(nn.Module):
    """Base class of the translation models: encode once, decode teacher-forced or step by step.

    Subclasses set `self.generator` (features (…, O) -> logits (…, V)) and implement `encode`, `decode`
    and `step`. Attention weights have shape (B, T, S) for single-head models and (B, T, N, S) with one
    map per head for multi-head ones; `step` returns the same without T. `model_args` holds the
    arguments `seq2seq.models.build.build_model` made the model from; checkpoints store them to rebuild it.
    """

    generator: nn.Module
    model_args: dict
    max_len: int | None = None  # the longest sequence the model reads (None: no limit)
    alignment_head: int | None = None  # multi-head models: the head alignments read (None: mean)

    def alignment_view(self, weights: Tensor) -> Tensor:
        """The attention that word alignments, heatmaps' summary panel and guided alignment read:
        (…, N, S) -> (…, S) for multi-head weights, the mean of the heads or `alignment_head`;
        single-head weights (…, S) are returned as they are."""
        return weights

    def encode(self, src: Tensor, src_lens: Tensor, src_mask: Tensor) -> State:
        """Args: src (B, S) ids; src_lens (B,); src_mask (B, S) bool. Returns the initial decoder state."""
        raise NotImplementedError

    def source_state(self, name: str) -> bool:
        """Whether state entry `name` depends on the source sentence alone (encoder outputs, their
        projections, the mask): the same in every hypothesis of a sentence and never changed by `step`,
        so beam search moves it only when sentences leave the batch, not at every reordering."""
        return False

    def decode(self, state: State, tgt_in: Tensor) -> tuple[Tensor, Tensor]:
        """Teacher-forced decoding of tgt_in (B, T). Returns features (B, T, O) and weights (B, T, [N,] S).

        The features are what the generator reads; callers apply it once, to the real positions only.
        """
        raise NotImplementedError

    def step(
        self, state: State, prev: Tensor, out: Tensor | None = None
    ) -> tuple[Tensor, Tensor, State]:
        """One decoder step from the previous tokens prev (B,). Returns logits (B, V), weights
        (B, [N,] S) and the new state; `decode` equals a loop of `step` over tgt_in. `out`: a (B, V)
        buffer the logits may be written into (`logits`); read the returned ones."""
        raise NotImplementedError

    def logits(self, features: Tensor, out: Tensor | None = None) -> Tensor:
        """The generator over features (B, O) -> logits (B, V), written into `out` when given.

        A search on a CPU passes one buffer for all its steps: a fresh (B, V) tensor there is mapped
        afresh and page-faults in (why: docs/results/benchmarks.md#figures-once-kept-in-the-model-code). The
        generator is an `nn.Linear` with a bias in every model.
        """
        if out is None:
            return self.generator(features)  # (B, V)
        return torch.addmm(self.generator.bias, features, self.generator.weight.t(), out=out)

    def forward(
        self, src: Tensor, src_lens: Tensor, src_mask: Tensor, tgt_in: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Teacher-forced logits (B, T, V) and attention weights (B, T, [N,] S); for inference and tests."""
        features, weights = self.decode(self.encode(src, src_lens, src_mask), tgt_in)
        return self.generator(features), weights


def reorder_state(state: State, index: Tensor) -> State:
    """Select (and repeat) batch rows of every state tensor: index (B',) -> state of batch size B'."""
    return {name: value.index_select(0, index) for name, value in state.items()}
