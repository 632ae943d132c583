"""Checkpoint files: written whole or not at all, read back into a plain model and its tokenizer.

What a checkpoint holds (a dict, saved with `torch.save`; training adds Lightning's own keys):

- `model_args`: the arguments `seq2seq.models.build.build_model` rebuilds the `nn.Module` from;
- `state_dict`: the model's weights, under `model.` (the LightningModule's attribute);
- `tokenizer`: the sentencepiece model proto, as bytes;
- `hyper_parameters`: the optimisation settings of the run (learning rate, smoothing, ...) and the
  corpus it trained on (`corpus`: dataset, data_dir, src, tgt), which `evaluate.py --split` reads;
- `seq2seq_version`: `seq2seq.__version__` of the code that wrote it. Version 0.1.0 kept the run's
  whole config in `hyper_parameters` instead of `model_args`; `read_checkpoint` still reads those.

The whole flag set of a run lives in its `hparams.yaml`, not here. Rebuilding a model needs no training
machinery (this is what `seq2seq.decoding.loading.load_model` does):

    checkpoint = torch.load(path, weights_only=True)
    model = build_model(checkpoint["model_args"])
    model.load_state_dict({k.removeprefix("model."): v for k, v in checkpoint["state_dict"].items()})
    tokenizer = Tokenizer.from_bytes(checkpoint["tokenizer"])

A kill -9 or a power cut during a plain `torch.save` leaves a truncated file where the last good
checkpoint was: `atomic_save` writes a temporary file in the same folder, fsyncs it and renames it over
the target, so readers see the old file or the new one, never half of one.
"""

import io
from pathlib import Path
from typing import Any

import torch

from seq2seq.atomic import atomic_write
from seq2seq.errors import UserError

# What seq2seq 0.1 wrote, frozen: the model settings each kind's config held (besides `vocab_size`),
# which `model_args` is rebuilt from when a 0.1 checkpoint is read. A record of that file format, not of
# today's models (their settings: seq2seq.models.config; the ones added since keep their defaults).
FORMAT_01_MODEL_KEYS = {
    "rnn": ("emb_size", "hidden_size", "score", "attn_size", "enc_layers", "dropout",
            "tie_embeddings"),
    "transformer": ("d_model", "heads", "layers", "ff_size", "dropout", "post_ln",
                    "tie_embeddings"),
}  # fmt: skip


def atomic_save(obj: Any, path: str | Path) -> None:
    """`torch.save(obj, path)` that leaves either the old file or the new one, never a torn one.

    The checkpoint is serialised in memory first: torch's writer turns a failed write (a full disk,
    `ulimit -f`) into an opaque RuntimeError, while a plain write raises the OSError that says why.
    """
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    atomic_write(path, lambda file: file.write(buffer.getbuffer()))


def read_checkpoint(path: str | Path, map_location: str = "cpu") -> dict[str, Any]:
    """The raw dict of a seq2seq checkpoint, else a UserError naming the file.

    `weights_only` loading: a checkpoint holds tensors, numbers, strings and bytes only, so a foreign
    pickle is refused instead of run. A checkpoint of seq2seq 0.1 (its run config instead of
    `model_args`) comes back with `model_args` derived from that config.
    """
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such checkpoint")
    try:
        checkpoint = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:  # torch raises several types for a truncated or non-checkpoint file
        raise UserError(
            f"{path}: not a readable checkpoint (truncated, corrupt or not a checkpoint: "
            f"{type(err).__name__})"
        ) from None
    if not isinstance(checkpoint, dict) or not {"tokenizer", "state_dict"} <= checkpoint.keys():
        raise UserError(f"{path}: not a seq2seq checkpoint (no tokenizer or weights inside)")
    if "model_args" not in checkpoint:
        checkpoint["model_args"] = _model_args_v01(path, checkpoint.get("hyper_parameters"))
    return checkpoint


def _model_args_v01(path: Path, hparams: Any) -> dict[str, Any]:
    """`model_args` of a seq2seq 0.1 checkpoint, whose hyper-parameters were the run's whole config."""
    config = hparams.get("config") if isinstance(hparams, dict) else None
    if not isinstance(config, dict) or "vocab_size" not in hparams:
        raise UserError(f"{path}: not a seq2seq checkpoint (no model arguments inside)")
    kind = config.get("model", "rnn")
    keys = FORMAT_01_MODEL_KEYS.get(kind)
    if keys is None or any(key not in config for key in keys):
        raise UserError(f"{path}: written by an unknown version of seq2seq (model {kind!r})")
    sizes = {key: config[key] for key in keys}
    return {"model": kind, "vocab_size": hparams["vocab_size"], **sizes}


# What a checkpoint's `hyper_parameters["corpus"]` names: enough to find the training corpus again.
CORPUS_KEYS = ("dataset", "data_dir", "src", "tgt")


def corpus_of(checkpoint: dict[str, Any]) -> dict[str, Any] | None:
    """The training corpus a checkpoint names (dataset, data_dir, src, tgt), or None if it names none."""
    hparams = checkpoint.get("hyper_parameters") or {}
    corpus = hparams.get("corpus") or hparams.get("config")  # seq2seq 0.1 kept the whole config
    if not isinstance(corpus, dict):
        return None
    return {key: corpus.get(key) for key in CORPUS_KEYS}


def model_weights(checkpoint: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The model's state dict out of a checkpoint (the system keeps the model under `model.`)."""
    return {k.removeprefix("model."): v for k, v in checkpoint["state_dict"].items()}
