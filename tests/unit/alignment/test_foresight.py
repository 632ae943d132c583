"""Fitting a foresight head on a frozen translator (seq2seq.alignment.foresight): on a copy task it
learns the diagonal the raw attention does not give, the translator is left unchanged, and a
checkpoint keeps the head."""

import random

import pytest
import torch

from seq2seq.alignment.foresight import (
    CHECKPOINT_KEY,
    FitSettings,
    fit_foresight,
    head_of,
    head_record,
    pair_batches,
)
from seq2seq.alignment.words import alignment_error_rate
from seq2seq.data.batching import collate
from seq2seq.errors import UserError
from seq2seq.models.build import build_model
from seq2seq.models.foresight import foresight_weights, translator_states

GRU = {"model": "rnn", "vocab_size": 24, "emb_size": 16, "hidden_size": 32, "dropout": 0.0}


def copy_pairs(n: int, seed: int) -> list[list[int]]:
    """`n` sentences of 3-7 distinct ids (4..23): a copy task's sources, which are its targets."""
    rng = random.Random(seed)
    return [rng.sample(range(4, GRU["vocab_size"]), rng.randint(3, 7)) for _ in range(n)]


def links(weights: torch.Tensor, batch: dict[str, torch.Tensor]) -> list[set]:
    """Per pair, (source, target) links from each real target piece (EOS left out) to its argmax."""
    out = [set()] * len(batch["index"])
    for b, i in enumerate(batch["index"].tolist()):
        T = int(batch["tgt_mask"][b].sum()) - 1  # without EOS
        best = weights[b, :T, : int(batch["src_lens"][b]) - 1].argmax(-1)  # (T,) without EOS
        out[i] = {(int(j), t) for t, j in enumerate(best.tolist())}
    return out


def test_a_fit_on_a_copy_task_learns_the_diagonal_the_raw_attention_lacks() -> None:
    torch.manual_seed(0)
    model = build_model(GRU).eval()  # frozen and untrained: its attention knows nothing
    before = {name: value.clone() for name, value in model.state_dict().items()}
    train = copy_pairs(300, seed=1)
    batches = pair_batches(train, train, batch_tokens=200, seed=1)
    fit = fit_foresight(model, batches, FitSettings(steps=60, lr=5e-2, seed=1))
    assert len(fit.losses) == 60 and fit.target_tokens > 0
    # It learned to predict y_t (through the frozen, untrained generator: never near 0).
    assert sum(fit.losses[-10:]) / 10 < 0.75 * fit.losses[0]
    for name, value in model.state_dict().items():  # the translator is not touched
        assert torch.equal(value, before[name]), name

    test = copy_pairs(40, seed=2)
    batch = collate([{"src_ids": s, "tgt_ids": s, "index": i} for i, s in enumerate(test)])
    with torch.no_grad():
        _, attention = model(batch["src"], batch["src_lens"], batch["src_mask"], batch["tgt_in"])
        weights, _ = foresight_weights(fit.head, translator_states(model, batch))
    diagonal = [({(j, j) for j in range(len(s))},) * 2 for s in test]  # (sure, possible)
    raw = alignment_error_rate(links(attention, batch), diagonal).aer
    foresight = alignment_error_rate(links(weights, batch), diagonal).aer
    assert foresight < 0.1 and foresight < raw  # seen: 0.03 against 0.81


def test_a_checkpoint_keeps_the_head_and_one_without_has_none() -> None:
    torch.manual_seed(0)
    model = build_model(GRU).eval()
    pairs = copy_pairs(20, seed=3)
    settings = FitSettings(steps=2, batch_tokens=100)
    fit = fit_foresight(model, pair_batches(pairs, pairs, 100, 1), settings)
    checkpoint = {"model_args": GRU, CHECKPOINT_KEY: head_record(fit, settings, "copy")}
    head = head_of(checkpoint)
    assert head is not None and not head.training
    for mine, kept in zip(fit.head.state_dict().values(), head.state_dict().values(), strict=True):
        assert torch.equal(mine, kept)
    assert checkpoint[CHECKPOINT_KEY]["fit"]["steps"] == 2
    assert head_of({"model_args": GRU}) is None


def test_bad_settings_and_a_transformer_are_refused() -> None:
    model = build_model(GRU)
    with pytest.raises(UserError, match="--steps 0: must be at least 1"):
        fit_foresight(model, iter(()), FitSettings(steps=0))
    with pytest.raises(UserError, match="--lr -1.0: must be positive"):
        fit_foresight(model, iter(()), FitSettings(lr=-1.0))
    with pytest.raises(UserError, match="--seed -1: must be 0 to 4294967295"):  # as train's
        fit_foresight(model, iter(()), FitSettings(seed=-1))
    args = {"model": "transformer", "vocab_size": 24, "d_model": 8, "heads": 2, "layers": 1,
            "ff_size": 16, "dropout": 0.0}  # fmt: skip
    with pytest.raises(UserError, match="GRU decoder"):
        fit_foresight(build_model(args), iter(()), FitSettings())
    with pytest.raises(UserError, match="no sentence pairs"):
        next(pair_batches([], [], 100, 1))
