"""Averaging reads a setting a checkpoint does not name as its default: an old checkpoint (written before
`--decoder` existed) and a new `bahdanau` one hold the same model; a `cgru` one does not. A foresight
head, fitted to one model's states, is left out of the mean and the note says so."""

from pathlib import Path

import pytest
import torch

from seq2seq.alignment.foresight import CHECKPOINT_KEY
from seq2seq.decoding.averaging import average_checkpoints, check_same_run
from seq2seq.errors import UserError
from seq2seq.models.build import build_model, complete_args

ARGS = {"model": "rnn", "vocab_size": 30, "emb_size": 8, "hidden_size": 12, "score": "additive",
        "attn_size": 10, "enc_layers": 1, "dropout": 0.0, "tie_embeddings": True}  # fmt: skip


def checkpoint(args: dict) -> dict:
    model = build_model(complete_args(args))
    return {"model_args": args, "tokenizer": b"spm", "state_dict": model.state_dict()}


def test_an_old_checkpoint_and_a_new_bahdanau_one_average() -> None:
    old, new = checkpoint(ARGS), checkpoint({**ARGS, "decoder": "bahdanau"})
    check_same_run("old.ckpt", old, "new.ckpt", new)  # would raise: decoder None vs 'bahdanau'
    assert complete_args(ARGS)["decoder"] == "bahdanau"


def test_a_cgru_checkpoint_is_still_refused_beside_an_old_one() -> None:
    old, cgru = checkpoint(ARGS), checkpoint({**ARGS, "decoder": "cgru"})
    with pytest.raises(UserError, match="decoder: 'bahdanau' vs 'cgru'"):
        check_same_run("old.ckpt", old, "cgru.ckpt", cgru)


def test_a_foresight_head_is_left_out_of_the_mean_and_the_note_names_its_file(
    tmp_path: Path,
) -> None:
    plain, headed = tmp_path / "plain.ckpt", tmp_path / "headed.ckpt"
    torch.save(checkpoint(ARGS), plain)
    torch.save({**checkpoint(ARGS), CHECKPOINT_KEY: {"weight": torch.zeros(2)}}, headed)
    notes: list[str] = []
    out = average_checkpoints([str(plain), str(headed)], tmp_path / "avg.ckpt", notes)
    assert CHECKPOINT_KEY not in torch.load(out, weights_only=True)
    assert len(notes) == 1 and notes[0].startswith(
        f"the foresight head of {headed} is not in {out}"
    )
    other = tmp_path / "other.ckpt"
    torch.save(checkpoint(ARGS), other)
    quiet: list[str] = []
    average_checkpoints([str(plain), str(other)], tmp_path / "both-plain.ckpt", quiet)
    assert quiet == []
