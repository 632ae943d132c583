"""The training procedure: `train(cfg)` plans the run, builds its callbacks and Trainer, prepares the
data, builds the system and fits (each a phase of seq2seq.training.phases); what `python -m seq2seq
train` (seq2seq.commands.train) runs after parsing the flags, and what a library caller runs with a
`TrainConfig` of its own.

Exceptions carry the outcome: a `UserError` (bad input, exit status 2), `TrainingDiverged` (3) and
`Stopped` (a polite stop, 4) are raised for the caller to report; 0 is returned when the run ends.
"""

import signal
import time
import typing

from seq2seq.errors import Stopped
from seq2seq.training.config import TrainConfig

STOP_SIGNALS = [signal.SIGTERM, *(getattr(signal, f"SIG{name}") for name in typing.get_args(
    typing.get_type_hints(TrainConfig)["stop_signal"]))]  # fmt: skip


def stop_message(stop: Stopped) -> str:
    """The one line a polite stop prints: why, what was saved, and how to go on."""
    if stop.step is None:
        return f"{stop.reason} before training began; nothing new to save"
    return (
        f"{stop.reason}: saved {stop.checkpoint} at update {stop.step}; continue with the same "
        f"command and --resume {stop.checkpoint}"
    )


def build_trainer(cfg: TrainConfig, callbacks: list, logger: object) -> "L.Trainer":  # noqa: F821
    """The run's Trainer (seq2seq.training.phases.build_trainer), looked up here when a run builds
    it: the seam where a benchmark adds callbacks of its own (seq2seq.benchmarks.memory)."""
    from seq2seq.training import phases

    return phases.build_trainer(cfg, callbacks, logger)


def train(cfg: TrainConfig, started: float | None = None) -> int:
    """Train as `cfg` says; `started`: `time.monotonic()` when this process began (default: now)."""
    started = time.monotonic() if started is None else started
    from seq2seq.training import phases  # Lightning and torch: imported once a run begins

    phases.quiet_lightning()
    plan = phases.plan_run(cfg)
    # Installed now, so a stop asked for while the data is prepared is not lost; it holds the signals
    # until this function ends (Lightning registers none of its own: seq2seq.training.stops).
    stop = phases.PoliteStop(plan.ckpt_dir, plan.cfg.stop_signal, plan.cfg.max_minutes, started)
    stop.install()
    try:
        callbacks = phases.run_callbacks(plan.cfg, plan.ckpt_dir, stop)
        trainer = build_trainer(plan.cfg, callbacks, plan.logger)
        phases.check_trainer(plan, trainer)
        data = phases.prepared_data(plan, trainer, stop)
        system = phases.system_for(plan, data)
        phases.fit(plan, trainer, system, data, stop)
        if trainer.is_global_zero:
            print(phases.report_end(trainer, started))
        return 0
    finally:
        # Also after a refusal or a stop before fit: a dead run's handler left in place would swallow
        # this process's next stop signal.
        stop.restore()
