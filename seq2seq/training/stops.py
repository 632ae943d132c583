"""Polite stops: a scheduler's signal, or this process's time budget, ends training on an update
boundary with `last.ckpt` written, and the script exits with `STOPPED` (never 0: that means trained).

Schedulers stop a job with SIGTERM, then SIGKILL after a grace period; SLURM can be told to send another
signal first (`--signal=USR1@120`). Lightning's own handling of SIGTERM raises `SystemExit` with no
status, so the job reports success with nothing saved, and its SLURM handler writes `hpc_ckpt_N.ckpt`
into the working folder, which `--resume` does not read. `PoliteStop` replaces both: its handler only
notes the signal; the next time a batch is about to start on an update boundary (no gradient half
accumulated), the run saves `last.ckpt` through the atomic checkpoint I/O and raises `Stopped`.

Saving there, before the batch, keeps the checkpoint's counters consistent: the batch about to start
is not counted as done, so a resume trains it; the updates before it are all in the weights. Under
DDP every rank must stop after the same update (the next gradient all-reduce would otherwise wait for
ever): one all-reduce of a flag per update decides it, only when there is more than one process.
"""

import signal
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from seq2seq.errors import Stopped


class PoliteStop(Callback):
    """Stop on SIGTERM, on `stop_signal`, or when `budget_minutes` of this process have passed.

    Args:
        checkpoint_dir: where `last.ckpt` is written.
        stop_signal: a name from `SIGNALS`, the signal a scheduler sends ahead of SIGTERM.
        budget_minutes: wall-clock minutes from `started` (this process's start); None: no budget.
        started: `time.monotonic()` when the process started.
    """

    def __init__(
        self,
        checkpoint_dir: str | Path,
        stop_signal: str = "USR1",
        budget_minutes: float | None = None,
        started: float | None = None,
    ) -> None:
        self.checkpoint = Path(checkpoint_dir) / "last.ckpt"
        self.signals = (signal.SIGTERM, getattr(signal, f"SIG{stop_signal}"))
        self.budget = None if budget_minutes is None else budget_minutes * 60.0
        self.started = time.monotonic() if started is None else started
        self.requested: str | None = None  # the reason to stop, set by a handler or the budget
        self._previous: dict[int, Any] = {}
        self._step: int | None = None

    def install(self) -> None:
        """Take over the stop signals (again: Lightning registers its own at the start of fit)."""
        for signum in self.signals:
            previous = signal.signal(signum, self._note)
            self._previous.setdefault(signum, previous)

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def _note(self, signum: int, frame: object) -> None:
        # A signal handler: note the request and return; the training loop acts on it.
        self.requested = self.requested or f"stopped by {signal.Signals(signum).name}"

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.install()
        self._step = trainer.global_step

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if trainer.global_step == self._step:
            return  # no update since the last check: the start of training, or mid-accumulation
        self._step = trainer.global_step
        if self.budget is not None and time.monotonic() - self.started >= self.budget:
            self.requested = self.requested or f"stopped by --max-minutes {self.budget / 60:g}"
        stop = self.requested is not None
        if trainer.world_size > 1:  # every rank stops after the same update, or none does
            flag = torch.tensor([int(stop)], device=pl_module.device)
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
            stop = bool(flag.item())
        if stop:
            self.requested = self.requested or "stopped by another rank's stop"
            trainer.save_checkpoint(
                self.checkpoint, weights_only=False
            )  # every rank; rank 0 writes
            raise Stopped(self.requested, trainer.global_step, self.checkpoint)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.restore()
