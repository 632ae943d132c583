"""The interface every translation model offers, which search and the training system rely on.

A model is encoded once per batch, then decoded either teacher-forced (training, `decode`) or one step at
a time (search, `step`). The decoder's state is a flat dict of batch-first tensors, so reordering it for
beam search is one `index_select` per entry, whatever the model keeps there (projected keys, a GRU
state, cached keys and values).

Dimension letters: B batch, S source length, T target length, O output-feature size, V vocabulary,
N attention heads (Transformer only).
"""

from typing import TYPE_CHECKING

from torch import Tensor, nn

if TYPE_CHECKING:
    from seq2seq.config import TrainConfig

State = dict[str, Tensor]


class Seq2Seq(nn.Module):
    """Base class of the translation models: encode once, decode teacher-forced or step by step.

    Subclasses set `self.generator` (features (…, O) -> logits (…, V)) and implement `encode`, `decode`
    and `step`. Attention weights have shape (B, T, S) for single-head models and (B, T, N, S) with one
    map per head for multi-head ones; `step` returns the same without T.
    """

    generator: nn.Module

    def encode(self, src: Tensor, src_lens: Tensor, src_mask: Tensor) -> State:
        """Args: src (B, S) ids; src_lens (B,); src_mask (B, S) bool. Returns the initial decoder state."""
        raise NotImplementedError

    def decode(self, state: State, tgt_in: Tensor) -> tuple[Tensor, Tensor]:
        """Teacher-forced decoding of tgt_in (B, T). Returns features (B, T, O) and weights (B, T, [N,] S).

        The features are what the generator reads; callers apply it once, to the real positions only.
        """
        raise NotImplementedError

    def step(self, state: State, prev: Tensor) -> tuple[Tensor, Tensor, State]:
        """One decoder step from the previous tokens prev (B,). Returns logits (B, V), weights
        (B, [N,] S) and the new state; `decode` equals a loop of `step` over tgt_in."""
        raise NotImplementedError

    def forward(
        self, src: Tensor, src_lens: Tensor, src_mask: Tensor, tgt_in: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Teacher-forced logits (B, T, V) and attention weights (B, T, [N,] S); for inference and tests."""
        features, weights = self.decode(self.encode(src, src_lens, src_mask), tgt_in)
        return self.generator(features), weights


def reorder_state(state: State, index: Tensor) -> State:
    """Select (and repeat) batch rows of every state tensor: index (B',) -> state of batch size B'."""
    return {name: value.index_select(0, index) for name, value in state.items()}


def build_model(cfg: "TrainConfig", vocab_size: int) -> Seq2Seq:
    """The model `cfg.model` at the sizes in `cfg`, for a joint vocabulary of `vocab_size` pieces."""
    if cfg.model == "rnn":
        from seq2seq.rnn import RNNSeq2Seq

        return RNNSeq2Seq(
            vocab_size=vocab_size,
            emb_size=cfg.emb_size,
            hidden_size=cfg.hidden_size,
            score=cfg.score,
            attn_size=cfg.attn_size,
            enc_layers=cfg.enc_layers,
            dropout=cfg.dropout,
            tie_embeddings=cfg.tie_embeddings,
        )
    if cfg.model == "transformer":
        from seq2seq.transformer import TransformerSeq2Seq

        return TransformerSeq2Seq.from_config(cfg, vocab_size)
    raise ValueError(f"unknown model {cfg.model!r}; choose rnn or transformer")
