"""Polite stops: a scheduler's signal, or this process's time budget, ends training on an update
boundary with `last.ckpt` written, and the script exits with `STOPPED` (never 0: that means trained).

Schedulers stop a job with SIGTERM, then SIGKILL after a grace period; SLURM can be told to send
another signal first (`#SBATCH --signal=USR1@120`, docs/guides/clusters.md). Lightning's own handling of
SIGTERM raises `SystemExit` with no status, so the job reports success with nothing saved; under DDP
its handler runs a collective inside the signal handler; and its SLURM handler writes
`hpc_ckpt_N.ckpt` into the working folder, which `--resume` does not read. `PoliteStop` replaces them
all, and holds the signals from `install` (train.py calls it before the data is prepared) to
`restore` (when train.py ends): Lightning has no setting that turns its registration off, so
`setup` gives the Trainer a signal connector that registers nothing (`_Unregistered`). The handler
only notes the signal, and the run acts on it at the next of these moments:

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
  another process's lock, and `spent` between chunks (train.py passes both in): the tokenizer and
  the cache are built inside `--max-minutes` too. Once the data is ready a sitting trains at least one update
  before its budget is looked at, so a chain of sittings always moves on.

A signal that comes after `install` but before training starts (while Lightning sets up, inside
`train_dataloader`) is acted on at the first update boundary: that sitting's first update is saved.

Each stop with a checkpoint leaves `stopped.json` beside `last.ckpt` (`MARKER`: the reason, the update,
the checkpoint), for a requeue script that cannot see the exit status (torchrun turns a rank's 4 into
1). A later sitting in that folder removes it only once it has saved a checkpoint of its own or
finished, so a sitting killed before either leaves the marker (and the checkpoint it names) in place.

Under DDP every rank must stop after the same update (the next gradient all-reduce would otherwise wait
for ever): one all-reduce of a flag per update decides it, only when there is more than one process,
always in a training hook, never in the signal handler. A signal that reaches one rank alone (rank 0
of Lightning's own launcher, whose handler used to pass it on) stops all of them at that agreement.
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
from lightning.pytorch.trainer.connectors.signal_connector import _SignalConnector
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
        self._handlers = contextlib.ExitStack()  # the handlers from before `install`, restored
        self._installed = False
        self._restore_at_teardown = False
        self._step: int | None = None
        self._saved = False  # this sitting has written a checkpoint (MARKER is then out of date)
        self._agreed_batches = 0  # validation batches every rank has (DDP)

    def install(self) -> None:
        """Take over the stop signals until `restore` (a second call changes nothing)."""
        if not self._installed:
            self._handlers.enter_context(handling(self.signals, self._note))
            self._installed = True

    def restore(self) -> None:
        """The handlers from before `install` come back."""
        self._handlers.close()
        self._installed = False

    def pending(self) -> str | None:
        """The reason to stop, when a stop signal has come (or the budget was found spent); None
        otherwise."""
        return self.requested

    def spent(self) -> str | None:
        """The reason to stop once `budget_minutes` have passed (or a signal came); None otherwise.
        Preparation asks it between chunks: the tokenizer and the cache are built inside the budget."""
        self._check_budget()
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

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # Called before Lightning registers its handlers: it finds a connector that registers none.
        trainer._signal_connector = _Unregistered(trainer)
        # train.py installs before the data is prepared, and restores when it ends.
        if not self._installed:
            self.install()
            self._restore_at_teardown = True  # a caller that did not: the handlers go with fit

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self._restore_at_teardown:
            self.restore()
            self._restore_at_teardown = False

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._step = trainer.global_step
        self._saved = False

    def on_save_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        # Called as the checkpoint is assembled; it is on disk when the next hook runs.
        self._saved = True

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._saved:
            self._forget_marker(trainer)
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

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._forget_marker(trainer)  # trained to the end: nothing to requeue

    def _forget_marker(self, trainer: L.Trainer) -> None:
        """This sitting saved or finished: the run is no longer the stopped one MARKER describes."""
        self._saved = False
        if trainer.is_global_zero:
            self.marker.unlink(missing_ok=True)


class _Unregistered(_SignalConnector):
    """Lightning's signal connector with no handler registered and none restored: PoliteStop holds
    the signals for the whole run. (Its `received_sigterm` stays False, so Lightning's loops never
    raise their SIGTERMException.)"""

    def register_signal_handlers(self) -> None:
        self.received_sigterm = False

    def teardown(self) -> None:
        pass


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
