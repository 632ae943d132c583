"""The model's settings: one dataclass, `ModelConfig`, whose fields are the training flags of the model
(`--score`, `--hidden-size`, ...) and, by name, the constructor arguments of `RNNSeq2Seq` and
`TransformerSeq2Seq` (`seq2seq.models.build.model_args_from` takes the ones a model kind accepts).

Each setting is stated here once, with its help and its range; `seq2seq.training.config.TrainConfig`
is the union of this and the other layers' settings, so the flags stay flat. The names `--score` and
`--decoder` offer are the keys of the models' own tables (`SCORERS`, `DECODERS`), not a second list.
"""

from dataclasses import dataclass
from typing import Literal

from seq2seq.cli import ModelDefaults, option
from seq2seq.errors import UserError
from seq2seq.models.attention import SCORERS
from seq2seq.models.rnn import DECODERS
from seq2seq.models.transformer_layers import POSITIONS
from seq2seq.recipes import RECIPE


@dataclass
class ModelConfig(ModelDefaults):
    """model: its kind and the sizes its constructor takes"""

    model: Literal["rnn", "transformer"] = option(
        "rnn", "model: the Bahdanau GRU or the Transformer"
    )
    score: Literal[tuple(SCORERS)] = option("additive", "attention scorer (rnn)")
    decoder: Literal[tuple(DECODERS)] = option(
        "bahdanau",
        "decoder step: Bahdanau's, whose query is s_{t-1}, or the conditional GRU of Nematus and "
        "Marian, whose query s'_t = GRU1(s_{t-1}, E y_{t-1}) has read the previous word (rnn)",
    )
    emb_size: int = option(
        None, "embedding size (rnn)", check="positive", per_model=RECIPE["emb_size"]
    )
    hidden_size: int = option(
        512, "GRU hidden size; the encoder gives each direction half (rnn)", check="positive"
    )
    attn_size: int | None = option(
        None, "additive attention size; default: hidden size (rnn)", check="positive"
    )
    enc_layers: int = option(1, "encoder GRU layers (rnn)", check="positive")
    d_model: int = option(256, "model width (transformer)", check="positive")
    heads: int = option(4, "attention heads (transformer)", check="positive")
    layers: int = option(3, "encoder and decoder layers each (transformer)", check="positive")
    ff_size: int = option(1024, "feed-forward inner size (transformer)", check="positive")
    post_ln: bool = option(False, "post-LN layers instead of pre-LN (transformer)")
    dropout: float = option(
        None,
        "dropout on embeddings, between layers and on output features",
        check="fraction",
        per_model=RECIPE["dropout"],
    )
    tie_embeddings: bool = option(
        True, "share source, target and output embeddings (joint vocabulary)"
    )
    alignment_layer: int = option(
        -1,
        "decoder layer whose cross-attention alignments and guidance use (-1: last) (transformer)",
    )
    alignment_heads: int = option(
        -1,
        "head of that layer that alignments and guidance use (-1: the mean of all heads) "
        "(transformer)",
    )

    @property
    def positions(self) -> int | None:
        """The longest side (subwords; EOS or BOS not counted) this model can read or write: the
        Transformer's positions less the one EOS or BOS takes; None for the GRU, which has no limit."""
        return POSITIONS - 1 if self.model == "transformer" else None

    def check(self) -> None:
        """The checks that tie two sizes together (ranges: `seq2seq.cli.check_fields`)."""
        if self.hidden_size % 2:
            raise UserError(
                f"`hidden_size` must be even (each encoder direction gets half), "
                f"got {self.hidden_size}"
            )
        if self.d_model % self.heads:
            raise UserError(f"`d_model` {self.d_model} is not divisible by `heads` {self.heads}")
        if not -self.layers <= self.alignment_layer < self.layers:
            raise UserError(
                f"`alignment_layer` must be in -{self.layers}..{self.layers - 1} "
                f"(`layers` {self.layers}), got {self.alignment_layer}"
            )
        if not -1 <= self.alignment_heads < self.heads:
            raise UserError(
                f"`alignment_heads` must be -1 (mean) or a head in 0..{self.heads - 1}, "
                f"got {self.alignment_heads}"
            )
