"""Models from their arguments: `build_model(model_args)`, and the arguments a training config implies.

`model_args` is a plain dict (`{"model": "rnn", "vocab_size": 8000, "emb_size": 256, ...}`): what a
checkpoint stores to rebuild the `nn.Module`, apart from the run's flags (log folder, devices, ...).
"""

from typing import Any

from seq2seq.checkpoint import MODEL_KEYS
from seq2seq.models.interface import Seq2Seq
from seq2seq.models.rnn import RNNSeq2Seq
from seq2seq.models.transformer import TransformerSeq2Seq

# Which attention alignments read (and guided alignment trains): kept apart from MODEL_KEYS, which
# a seq2seq 0.1 checkpoint's config must hold in full (seq2seq.checkpoint); older ones lack these.
ALIGNMENT_KEYS = {"rnn": (), "transformer": ("alignment_layer", "alignment_heads")}
MODELS = {"rnn": RNNSeq2Seq, "transformer": TransformerSeq2Seq}


def model_args_from(config: Any, vocab_size: int) -> dict[str, Any]:
    """The `model_args` of the model `config.model` at the sizes in `config` (a TrainConfig, or any
    object with those attributes), for a joint vocabulary of `vocab_size` pieces."""
    if config.model not in MODEL_KEYS:
        raise ValueError(f"unknown model {config.model!r}; choose one of {', '.join(MODEL_KEYS)}")
    keys = MODEL_KEYS[config.model] + ALIGNMENT_KEYS[config.model]
    sizes = {key: getattr(config, key) for key in keys}
    return {"model": config.model, "vocab_size": vocab_size, **sizes}


def build_model(model_args: dict[str, Any]) -> Seq2Seq:
    """A freshly initialised model from `model_args`; it keeps them as `model.model_args`."""
    args = dict(model_args)
    kind = args.pop("model", None)
    if kind not in MODELS:
        raise ValueError(f"unknown model {kind!r}; choose one of {', '.join(MODELS)}")
    model = MODELS[kind](**args)
    model.model_args = dict(model_args)
    return model
