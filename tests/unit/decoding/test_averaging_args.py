"""Averaging reads a setting a checkpoint does not name as its default: an old checkpoint (written before
`--decoder` existed) and a new `bahdanau` one hold the same model; a `cgru` one does not."""

import pytest

from seq2seq.decoding.averaging import check_same_run
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
