"""`accelerate` a second time changes nothing, whether it is handed the model or what it returned."""

import pytest

from seq2seq.models.build import build_model
from seq2seq.models.kernels import accelerate


@pytest.mark.parametrize("compile", [False, True])
def test_accelerating_again_changes_nothing(compile: bool) -> None:
    model = build_model({"model": "rnn", "vocab_size": 30, "emb_size": 8, "hidden_size": 8})
    runner = accelerate(model, compile=compile)
    kinds = [type(module) for module in model.modules()]
    assert accelerate(runner, compile=compile) is runner  # what the first call gave, as it is
    again = accelerate(model, compile=compile)
    assert [type(module) for module in model.modules()] == kinds
    assert getattr(again, "model", again) is model
