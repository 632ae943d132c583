"""Polite stops: a scheduler's signal, or this process's time budget, ends training on an update
boundary with `last.ckpt` written, and the script exits with `STOPPED` (never 0: that means trained).

Schedulers stop a job with SIGTERM, then SIGKILL after a grace period; SLURM can be told to send
another signal first (`#SBATCH --signal=USR1@120`, docs/guides/clusters.md). Lightning's own handling of
SIGTERM raises `SystemExit` with no status, so the job reports success with nothing saved, and its
SLURM handler writes `hpc_ckpt_N.ckpt` into the working folder, which `--resume` does not read. `PoliteStop` replaces both: its handler only
notes the signal, and the run acts on it at the next of these moments:

- a training batch about to start on an update boundary (no gradient half accumulated): the run saves
  `last.ckpt` through the atomic checkpoint I/O and raises `Stopped`. Saving there, before the batch,
  keeps the checkpoint's counters consistent: the batch about to start is not counted as done, so a
  resume trains it; the updates before it are all in the weights.
- a validation batch about to start (a signal, or `--max-minutes` run out during the pass): the
  weights are still those of the last update, and the checkpoint records the validation pass as
  begun at its first batch with none done, so a resume runs that validation whole (Lightning's
  "restarted mid-evaluation" path) before it trains on. A pass ended halfway would give a BLEU of
  part of the split, and the best-checkpoint tracking would compare it with whole ones.
- the data being prepared: seq2seq.data.prepare asks `pending` between chunks and while it waits for
  another process's lock (train.py passes it in).

Each stop with a checkpoint leaves `stopped.json` beside `last.ckpt` (`MARKER`: the reason, the update,
the checkpoint), for a requeue script that cannot see the exit status (torchrun turns a rank's 4 into
1); the next run in that folder removes it when training starts, so it marks only the last run.

Under DDP every rank must stop after the same update (the next gradient all-reduce would otherwise wait
for ever): one all-reduce of a flag per update decides it, only when there is more than one process.
Validation batches are agreed on the same way, on the batches every rank has (a rank may have one more).
"""

import contextlib
import json
import signal
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.states import TrainerFn

from seq2seq.atomic import atomic_write_text
from seq2seq.errors import Stopped
from seq2seq.signals import handling

MARKER = "stopped.json"  # beside last.ckpt while the run in that folder is stopped, not finished


class PoliteStop(Callback):
    """Stop on SIGTERM, on `stop_signal`, or when `budget_minutes` of this process have passed.

    Args:
        checkpoint_dir: where `last.ckpt` (and `MARKER`) are written.
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
        self.marker = Path(checkpoint_dir) / MARKER
        self.signals = (signal.SIGTERM, getattr(signal, f"SIG{stop_signal}"))
        self.budget = None if budget_minutes is None else budget_minutes * 60.0
        self.started = time.monotonic() if started is None else started
        self.requested: str | None = None  # the reason to stop, set by a handler or the budget
        self._handlers = contextlib.ExitStack()  # each install's handlers, restored in reverse
        self._step: int | None = None
        self._agreed_batches = 0  # validation batches every rank has (DDP)

    def install(self) -> None:
        """Take over the stop signals (again: Lightning registers its own at the start of fit)."""
        self._handlers.enter_context(handling(self.signals, self._note))

    def restore(self) -> None:
        """The handlers from before the first `install` come back."""
        self._handlers.close()

    def pending(self) -> str | None:
        """The reason to stop, when a stop signal has come; None otherwise."""
        return self.requested

    def _note(self, signum: int, frame: object) -> None:
        # A signal handler: note the request and return; the training loop acts on it.
        self.requested = self.requested or f"stopped by {signal.Signals(signum).name}"

    def mark(self, stop: Stopped, step: int | None = None) -> None:
        """Leave `MARKER` beside `last.ckpt` when there is one to resume (call on rank 0 only).
        `step`: the update `last.ckpt` holds, for a stop before training began (`stop.step` None)."""
        if self.checkpoint.exists():
            step = stop.step if stop.step is not None else step
            record = {"reason": stop.reason, "step": step, "checkpoint": str(self.checkpoint)}
            atomic_write_text(self.marker, json.dumps(record) + "\n")

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.install()
        self._step = trainer.global_step
        if trainer.is_global_zero:
            self.marker.unlink(missing_ok=True)  # this run is going on: no longer a stopped one

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if trainer.global_step == self._step:
            return  # no update since the last check: the start of training, or mid-accumulation
        self._step = trainer.global_step
        self._check_budget()
        if _agree(trainer, pl_module, self.requested is not None):
            self._stop(trainer)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.world_size > 1 and _fitting(trainer):  # the same collective on every rank
            count = torch.tensor([int(sum(trainer.num_val_batches))], device=pl_module.device)
            torch.distributed.all_reduce(count, op=torch.distributed.ReduceOp.MIN)
            self._agreed_batches = int(count.item())

    def on_validation_batch_start(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if not _fitting(trainer):
            return  # trainer.validate: nothing to save
        if trainer.world_size > 1 and batch_idx >= self._agreed_batches:
            return  # a batch another rank does not have: no collective; after the pass, then
        self._check_budget()  # a long pass would otherwise overrun a scheduler's time limit
        if _agree(trainer, pl_module, self.requested is not None):
            _restart_validation(trainer)
            self._stop(trainer)

    def _check_budget(self) -> None:
        """Note a stop once `--max-minutes` have passed (each rank by its own clock; `_agree` joins)."""
        if self.budget is not None and time.monotonic() - self.started >= self.budget:
            self.requested = self.requested or f"stopped by --max-minutes {self.budget / 60:g}"

    def _stop(self, trainer: L.Trainer) -> None:
        self.requested = self.requested or "stopped by another rank's stop"
        trainer.save_checkpoint(self.checkpoint, weights_only=False)  # every rank; rank 0 writes
        stop = Stopped(self.requested, trainer.global_step, self.checkpoint)
        if trainer.is_global_zero:
            self.mark(stop)
        raise stop

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.restore()


def _fitting(trainer: L.Trainer) -> bool:
    return trainer.state.fn == TrainerFn.FITTING and not trainer.sanity_checking


def _agree(trainer: L.Trainer, pl_module: L.LightningModule, stop: bool) -> bool:
    """Whether any rank stops (every rank calls this at the same point); `stop` with one process."""
    if trainer.world_size > 1:
        flag = torch.tensor([int(stop)], device=pl_module.device)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        stop = bool(flag.item())
    return stop


def _restart_validation(trainer: L.Trainer) -> None:
    """Count the validation pass in progress as begun at its first batch with none done.

    Called in `on_validation_batch_start` of batch k, where the counters read ready k + 1, started,
    processed and completed k (this pass; `total` adds the passes before it this epoch). A
    checkpoint saved after this reads ready = started = 1, processed = completed = 0: Lightning
    restores that as "restarted mid-evaluation" and runs the pass again from a fresh loader before
    the next training batch. Left as they were, the counters would make a resume skip the pass.
    """
    progress = trainer.fit_loop.epoch_loop.val_loop.batch_progress
    done = progress.current.completed
    for counts in (progress.current, progress.total):
        counts.ready, counts.processed, counts.completed = (
            counts.ready - done,
            counts.processed - done,
            counts.completed - done,
        )
        counts.started = counts.ready
