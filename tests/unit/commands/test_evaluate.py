"""Evaluation and averaging are library functions whose results are the commands' (scripts/evaluate.py,
translate.py and average_checkpoints.py on a checkpoint: tests/e2e/test_evaluate.py)."""

import json
from pathlib import Path

import pytest
import torch

from seq2seq.commands import evaluate


def test_evaluate_and_averaging_are_library_functions_with_the_commands_results(
    tiny_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """`seq2seq.decoding.evaluate.evaluate` gives the figures `seq2seq evaluate --json` writes, and
    `average_checkpoints` the file `seq2seq average` writes: the commands only parse and print."""
    from seq2seq.decoding.averaging import average_checkpoints
    from seq2seq.decoding.evaluate import evaluate as evaluate_checkpoint
    from seq2seq.decoding.search_config import SearchConfig

    called = evaluate_checkpoint(
        tiny_checkpoint, "test", search=SearchConfig(beam=2), out=tmp_path / "called.hyp"
    )
    argv = [str(tiny_checkpoint), "--split", "test", "--beam", "2", "--out",
            str(tmp_path / "run.hyp"), "--json", str(tmp_path / "run.json")]  # fmt: skip
    assert evaluate.main(argv) == 0
    ran = json.loads((tmp_path / "run.json").read_text())
    timing = ("seconds", "sentences_per_second", "hypotheses")
    assert {k: v for k, v in called.items() if k not in timing} == {
        k: v for k, v in ran.items() if k not in timing
    }
    assert (tmp_path / "called.hyp").read_text() == (tmp_path / "run.hyp").read_text()
    out = average_checkpoints([tiny_checkpoint, tiny_checkpoint], tmp_path / "same.ckpt")
    weights = torch.load(out, weights_only=True)["state_dict"]
    saved = torch.load(tiny_checkpoint, weights_only=True)["state_dict"]
    assert all(torch.equal(weights[name], saved[name]) for name in saved)  # the mean of one run
