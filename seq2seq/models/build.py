"""Models from their arguments: `build_model(model_args)`, and the arguments a config implies.

`model_args` is a plain dict (`{"model": "rnn", "vocab_size": 8000, "emb_size": 256, ...}`): what a
checkpoint stores to rebuild the `nn.Module`, apart from the run's flags (log folder, devices, ...).
Which settings a model kind takes is read off its constructor: the `ModelConfig` fields it names.
"""

import dataclasses
import inspect
from typing import Any

from seq2seq.errors import UserError
from seq2seq.models.config import ModelConfig
from seq2seq.models.interface import Seq2Seq
from seq2seq.models.rnn import RNNSeq2Seq
from seq2seq.models.transformer import TransformerSeq2Seq

MODELS = {"rnn": RNNSeq2Seq, "transformer": TransformerSeq2Seq}


def model_keys(kind: str) -> tuple[str, ...]:
    """The `ModelConfig` fields model `kind` is built from: those its constructor takes."""
    if kind not in MODELS:
        raise ValueError(f"unknown model {kind!r}; choose one of {', '.join(MODELS)}")
    taken = inspect.signature(MODELS[kind]).parameters
    return tuple(f.name for f in dataclasses.fields(ModelConfig) if f.name in taken)


def check_kind(config: Any) -> None:
    """Refuse a setting that only another model kind's constructor takes, set in `config` (a
    `ModelConfig` or a `TrainConfig`) to other than its value unset: `--model transformer
    --hidden-size 1024` would otherwise train the default Transformer, the size never read."""
    own = model_keys(config.model)
    for f in dataclasses.fields(ModelConfig):
        readers = [kind for kind in MODELS if f.name in model_keys(kind)]
        if not readers or f.name in own:
            continue
        defaults = f.metadata["per_model"]  # per model kind; a kind not named takes the first's
        unset = defaults.get(config.model, next(iter(defaults.values()))) if defaults else f.default
        value = getattr(config, f.name)
        if value != unset:
            shown = "" if isinstance(value, bool) else f" {value}"
            raise UserError(
                f"`{f.name}`{shown}: a setting of --model {' and '.join(readers)}, which --model "
                f"{config.model} does not read (leave it out)"
            )


def model_args_from(config: Any, vocab_size: int) -> dict[str, Any]:
    """The `model_args` of the model `config.model` at the sizes in `config` (a `ModelConfig`, or a
    `TrainConfig`, which holds one), for a joint vocabulary of `vocab_size` pieces."""
    sizes = {key: getattr(config, key) for key in model_keys(config.model)}
    return {"model": config.model, "vocab_size": vocab_size, **sizes}


def complete_args(model_args: dict[str, Any]) -> dict[str, Any]:
    """`model_args` with every setting its kind's constructor takes, its default where none is named:
    a checkpoint written before a setting existed (an old one names no `decoder`) says the same model
    as one that names the default."""
    kind = model_args.get("model")
    if kind not in MODELS:
        raise ValueError(f"unknown model {kind!r}; choose one of {', '.join(MODELS)}")
    taken = inspect.signature(MODELS[kind]).parameters
    defaults = {k: p.default for k, p in taken.items() if p.default is not inspect.Parameter.empty}
    return defaults | dict(model_args)


def build_model(model_args: dict[str, Any]) -> Seq2Seq:
    """A freshly initialised model from `model_args`; it keeps them as `model.model_args`."""
    args = dict(model_args)
    kind = args.pop("model", None)
    if kind not in MODELS:
        raise ValueError(f"unknown model {kind!r}; choose one of {', '.join(MODELS)}")
    model = MODELS[kind](**args)
    model.model_args = dict(model_args)
    return model
