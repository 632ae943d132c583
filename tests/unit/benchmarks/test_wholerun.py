"""A whole run's counts and phases: what `scripts/benchmark.py` multiplies its measured parts by."""

import pytest
import torch
from torch import nn

from seq2seq.benchmarks.wholerun import (
    PhaseTimes,
    project,
    render_whole,
    run_shape,
    time_checkpoint,
    whole_runs,
)

SENTENCES = {"val_sentences": 1014, "test_sentences": 1000}


def test_epochs_count_updates_and_one_validation_each() -> None:
    shape = run_shape(123, 30, -1, None, 1, **SENTENCES)
    assert (shape.updates, shape.validations, shape.epochs) == (3690, 30, 30.0)


def test_max_steps_val_every_and_accumulation_change_the_counts() -> None:
    assert run_shape(123, 30, 1000, None, 1, **SENTENCES).updates == 1000
    assert (
        run_shape(123, 30, 1000, None, 1, **SENTENCES).validations == 9
    )  # 8 whole epochs and a part
    assert run_shape(123, 30, -1, 500, 1, **SENTENCES).validations == 7  # every 500 of 3,690
    two = run_shape(124, 30, -1, None, 2, **SENTENCES)  # two batches an update
    assert (two.updates_per_epoch, two.updates) == (62, 1860)


def test_each_phase_is_its_time_once_times_its_count() -> None:
    shape = run_shape(100, 10, -1, None, 1, **SENTENCES)
    phases = PhaseTimes(prepare_sec=50.0, prepare_cold=True, checkpoint_sec=0.5)
    run = project(
        shape, phases, sec_per_update=2.0, greedy_sent_per_sec=100.0, beam5_sent_per_sec=20.0
    )
    assert run["updates_sec"] == 2000.0
    assert run["validation_sec"] == pytest.approx(10 * 10.14)
    assert run["checkpoints_sec"] == 10 * 2 * 0.5  # last.ckpt and a best one, each validation
    assert (run["prepare_sec"], run["scoring_sec"]) == (50.0, 50.0)
    assert run["total_sec"] == pytest.approx(2000 + 101.4 + 10 + 50 + 50)
    lines = render_whole(whole_runs(shape, phases, {"fast": 2.0, "bf16": 1.0}, {
        "greedy_sent_per_sec": 100.0, "beam5_sent_per_sec": 20.0}))  # fmt: skip
    assert lines[0].startswith("whole run (estimated") and "1,000 updates" in lines[0]
    assert lines[1].startswith("  fast: 36.9 min: updates 90%")
    assert lines[2].startswith("  bf16: 20.2 min: updates 83%")


def test_a_checkpoint_is_timed_with_the_optimizer_state_and_leaves_no_file(tmp_path) -> None:
    model = nn.Linear(64, 64)
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 64)).sum().backward()
    opt.step()
    assert time_checkpoint(model, opt) > 0
