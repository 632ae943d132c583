"""Where a whole training run's time goes: each phase timed once, then counted as often as the run does it.

`scripts/benchmark.py` times an update of each path; a run is more than its updates. Here the other
phases are timed in the same process, on the same model and data:

- preparation: reading the corpus, the tokenizer and the encoded cache (cold the first time, a read
  of the cache after);
- validation: greedy decoding of the validation sources, as `TranslationSystem` does at each
  validation (`--val-beam 1`), at the speed `decode_speed` measured;
- checkpoints: one save of the model's weights and Adam's state, as `last.ckpt` is written (the best
  checkpoints hold the weights alone; they are counted as one more save a validation: an upper bound);
- scoring: beam-5 decoding of as many sentences as the test split has, as `evaluate.py` does once.

`project` multiplies each by the run's counts: updates (epochs x batches an epoch, or --max-steps),
validations (one an epoch, or one every --val-every updates) and one scoring. The result is an
estimate from measured parts, side by side for every path, not a timed run: what a whole run costs on
this machine, and which phase a speed-up has to take.
"""

import math
import os
import tempfile
import time
from dataclasses import asdict, dataclass

import torch
from torch import nn

PHASES = ("updates", "validation", "checkpoints", "prepare", "scoring")  # as `project` names them


@dataclass(frozen=True)
class RunShape:
    """How often a run does each phase: its updates, validations and scorings."""

    updates: int
    updates_per_epoch: int
    epochs: float
    validations: int
    val_sentences: int
    test_sentences: int


@dataclass(frozen=True)
class PhaseTimes:
    """Seconds each phase took once, measured (preparation: this process's, cold or warm)."""

    prepare_sec: float
    prepare_cold: bool
    checkpoint_sec: float


def run_shape(
    updates_per_epoch: int,
    max_epochs: int,
    max_steps: int,
    val_every: int | None,
    accumulate: int,
    val_sentences: int,
    test_sentences: int,
) -> RunShape:
    """The counts of a run of `max_epochs` (or `max_steps` updates, when set) over batches an epoch.

    `updates_per_epoch` counts optimizer updates (an update accumulates `accumulate` batches).
    """
    per_epoch = max(1, updates_per_epoch // max(1, accumulate))
    updates = per_epoch * max_epochs if max_steps < 0 else min(max_steps, per_epoch * max_epochs)
    validations = updates // val_every if val_every else math.ceil(updates / per_epoch)
    return RunShape(
        updates=updates,
        updates_per_epoch=per_epoch,
        epochs=updates / per_epoch,
        validations=validations,
        val_sentences=val_sentences,
        test_sentences=test_sentences,
    )


def time_checkpoint(model: nn.Module, optimizer: torch.optim.Optimizer) -> float:
    """Seconds to write the model's weights and the optimizer's state to a file and fsync it."""
    state = {"state_dict": model.state_dict(), "optimizer": optimizer.state_dict()}
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "timed.ckpt")
        start = time.perf_counter()
        with open(path, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        return time.perf_counter() - start


def project(
    shape: RunShape,
    phases: PhaseTimes,
    sec_per_update: float,
    greedy_sent_per_sec: float,
    beam5_sent_per_sec: float,
) -> dict[str, float]:
    """Seconds of a whole run in each phase, and their sum (`total_sec`), for one path's update."""
    parts = {
        "prepare_sec": phases.prepare_sec,
        "updates_sec": shape.updates * sec_per_update,
        "validation_sec": shape.validations * shape.val_sentences / greedy_sent_per_sec,
        "checkpoints_sec": shape.validations * 2 * phases.checkpoint_sec,
        "scoring_sec": shape.test_sentences / beam5_sent_per_sec,
    }
    return parts | {"total_sec": sum(parts.values())}


def whole_runs(
    shape: RunShape, phases: PhaseTimes, sec_per_update: dict[str, float], decode: dict
) -> dict:
    """Every path's projected run, with the counts and phase times it was made from."""
    runs = {
        name: project(
            shape, phases, sec, decode["greedy_sent_per_sec"], decode["beam5_sent_per_sec"]
        )
        for name, sec in sec_per_update.items()
    }
    return {"shape": asdict(shape), "phases": asdict(phases), "paths": runs}


def hours(seconds: float) -> str:
    """1.23 h, or 12.3 min under an hour."""
    return f"{seconds / 3600:.2f} h" if seconds >= 3600 else f"{seconds / 60:.1f} min"


def render_whole(w: dict) -> list[str]:
    """The printed lines: the run's counts, then a row per path with each phase's share."""
    s, p = w["shape"], w["phases"]
    lines = [
        f"whole run (estimated from the parts measured above): {s['updates']:,} updates "
        f"({s['epochs']:.1f} epochs of {s['updates_per_epoch']:,}), {s['validations']} greedy "
        f"validations of {s['val_sentences']:,} sentences, one beam-5 scoring of "
        f"{s['test_sentences']:,}; preparation {p['prepare_sec']:.1f} s "
        f"({'cold' if p['prepare_cold'] else 'warm cache'}), a checkpoint {p['checkpoint_sec']:.2f} s"
    ]
    for name, r in w["paths"].items():
        share = {key: 100 * r[f"{key}_sec"] / r["total_sec"] for key in PHASES}
        phases = ", ".join(f"{key} {share[key]:.0f}%" for key in PHASES)
        lines.append(f"  {name}: {hours(r['total_sec'])}: {phases}")
    return lines
