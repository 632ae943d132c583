"""Checkpoints load to a plain model and tokenizer, from today's format and from seq2seq 0.1's."""

import dataclasses
from pathlib import Path

import pytest
import torch

from seq2seq.checkpoint import FORMAT_01_MODEL_KEYS, corpus_of, read_checkpoint
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.decoding.loading import load_model
from seq2seq.errors import UserError
from seq2seq.models.build import build_model
from seq2seq.training.config import TrainConfig


def test_the_readme_recipe_equals_load_model(tiny_checkpoint: Path) -> None:
    checkpoint = torch.load(tiny_checkpoint, weights_only=True)
    model = build_model(checkpoint["model_args"])
    model.load_state_dict(
        {k.removeprefix("model."): v for k, v in checkpoint["state_dict"].items()}
    )
    tokenizer = Tokenizer.from_bytes(checkpoint["tokenizer"])
    loaded, loaded_tokenizer = load_model(tiny_checkpoint)
    assert not loaded.training
    assert loaded_tokenizer.to_bytes() == tokenizer.to_bytes()
    ours, theirs = model.state_dict(), loaded.state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    # Run control stays in hparams.yaml: the checkpoint holds no log folder or device.
    assert "config" not in checkpoint["hyper_parameters"]
    assert corpus_of(checkpoint)["src"] == "de" and corpus_of(checkpoint)["tgt"] == "en"


def test_a_checkpoint_of_seq2seq_0_1_loads_the_same_model(
    tiny_checkpoint: Path, tmp_path: Path
) -> None:
    """0.1 kept the run's whole config in hyper_parameters and no model_args."""
    checkpoint = torch.load(tiny_checkpoint, weights_only=True)
    args = checkpoint.pop("model_args")
    config = dataclasses.asdict(TrainConfig()) | {
        k: v for k, v in args.items() if k != "vocab_size"
    }
    config |= {"data_dir": "corpus", "src": "de", "tgt": "en"}
    checkpoint["hyper_parameters"] = {"config": config, "vocab_size": args["vocab_size"]}
    torch.save(checkpoint, tmp_path / "old.ckpt")
    # The settings 0.1 had; those added since (`decoder`) are left out and keep their defaults.
    kept = ("model", "vocab_size", *FORMAT_01_MODEL_KEYS[args["model"]])
    assert read_checkpoint(tmp_path / "old.ckpt")["model_args"] == {k: args[k] for k in kept}
    old, _ = load_model(tmp_path / "old.ckpt")
    new, _ = load_model(tiny_checkpoint)
    assert all(torch.equal(a, b) for a, b in zip(old.parameters(), new.parameters(), strict=True))
    assert corpus_of(read_checkpoint(tmp_path / "old.ckpt"))["data_dir"] == "corpus"


def test_foreign_and_incomplete_files_are_refused_naming_them(
    tiny_checkpoint: Path, tmp_path: Path
) -> None:
    torch.save({"weights": torch.zeros(2)}, tmp_path / "other.ckpt")
    with pytest.raises(UserError, match="other.ckpt: not a seq2seq checkpoint"):
        load_model(tmp_path / "other.ckpt")
    checkpoint = torch.load(tiny_checkpoint, weights_only=True)
    del checkpoint["model_args"]  # neither today's model_args nor 0.1's config
    torch.save(checkpoint, tmp_path / "bare.ckpt")
    with pytest.raises(UserError, match="bare.ckpt: not a seq2seq checkpoint"):
        load_model(tmp_path / "bare.ckpt")
    checkpoint = torch.load(tiny_checkpoint, weights_only=True)
    checkpoint["model_args"] = {**checkpoint["model_args"], "hidden_size": 8}
    torch.save(checkpoint, tmp_path / "misfit.ckpt")
    with pytest.raises(UserError, match="misfit.ckpt: weights do not fit"):
        load_model(tmp_path / "misfit.ckpt")
