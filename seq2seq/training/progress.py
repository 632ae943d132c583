"""What a user sees of a run while it trains: one progress bar over the whole run, and the run's
expected length, estimated once the first updates are timed.

Lightning's bar counts the batches of one epoch and starts again at every epoch, so it never says how
far the run is or when it ends. `RunProgressBar` counts updates from the first to the run's last
(`Trainer.estimated_stepping_batches`: max_epochs x updates per epoch, or max_steps if sooner), so
tqdm's rate and time left are those of the run, validations included (they are wall time between
updates). `RunEstimate` prints the plan in words once: updates, epochs, and minutes, first from the
timed updates alone, then again once a validation has run, with the validations still to come.
Both are estimates from the updates timed so far, and say so.
"""

import math
import time

import lightning as L
from lightning.pytorch.callbacks import Callback, TQDMProgressBar
from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm

# Updates not timed (the first ones pay for warm-up: allocations, compilation), then updates timed.
SKIPPED, TIMED = 5, 20


def run_updates(trainer: L.Trainer) -> int:
    """The updates the whole run makes (a resumed run's earlier ones included)."""
    return max(int(trainer.estimated_stepping_batches), 1)


def updates_per_epoch(trainer: L.Trainer) -> int:
    """Optimizer updates in one epoch (an epoch's last, shorter window is one update too)."""
    return max(math.ceil(trainer.num_training_batches / trainer.accumulate_grad_batches), 1)


class RunProgressBar(TQDMProgressBar):
    """tqdm's bar over the run's updates (n / total, rate, time left), titled by the epoch.

    tqdm's bar rather than Lightning's Rich one, whether or not `rich` is installed: the Rich bar
    writes nothing to a log file until the run ends.
    """

    def init_train_tqdm(self) -> Tqdm:
        bar = super().init_train_tqdm()
        bar.unit = "update"
        return bar

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        bar = self.train_progress_bar
        # A resumed run's bar starts where it stopped; tqdm's rate counts from `initial` on.
        bar.reset(total=run_updates(trainer))
        bar.initial = bar.n = trainer.global_step
        bar.refresh()

    def on_train_epoch_start(self, trainer: L.Trainer, *_: object) -> None:
        # No reset: the bar is the run's, only its title names the epoch.
        epochs = math.ceil(run_updates(trainer) / updates_per_epoch(trainer))
        self.train_progress_bar.set_description(f"Epoch {trainer.current_epoch + 1}/{epochs}")

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict:
        metrics = super().get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)  # the version folder, already printed as the log folder
        return metrics

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: object, batch: object,
        batch_idx: int,
    ) -> None:  # fmt: skip
        bar = self.train_progress_bar
        if bar is not None and not bar.disable and trainer.global_step != bar.n:
            bar.n = trainer.global_step
            bar.set_postfix(self.get_metrics(trainer, pl_module))  # refreshes the bar too


class RunEstimate(Callback):
    """Prints the run's expected length: once `TIMED` updates after the first `SKIPPED` are timed,
    and once more after the first validation, with the validations to come priced in."""

    def __init__(
        self, val_every: int | None = None, skipped: int = SKIPPED, timed: int = TIMED
    ) -> None:
        """`val_every`: updates between validations (`--val-every`; None: once an epoch)."""
        self.val_every, self.skipped, self.timed = val_every, skipped, timed
        self._start: tuple[int, float] | None = None  # (update, time) where timing began
        self._per_update: float | None = None  # seconds an update, validation excluded
        self._validating_since: float | None = None
        self._validation_seconds = 0.0  # spent validating, kept out of the time per update
        self._last_validation: float | None = None  # seconds the latest validation took
        self._said: set[bool] = set()  # estimates printed: without validation priced, with it

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._first = trainer.global_step  # a resumed run times its own updates
        self._began = time.monotonic()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: object, batch: object,
        batch_idx: int,
    ) -> None:  # fmt: skip
        step, now = trainer.global_step, time.monotonic() - self._validation_seconds
        if self._start is None:
            if step >= self._first + self.skipped:
                self._start = (step, now)
            return
        if self._per_update is None:
            if step < self._start[0] + self.timed:
                return
            self._per_update = (now - self._start[1]) / (step - self._start[0])
        priced = self._last_validation is not None
        if priced not in self._said and True not in self._said:
            self._said.add(priced)
            self._say(trainer, self._plan(trainer))

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._validating_since = time.monotonic()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._validating_since is not None:  # said at the next update, below the bar again
            self._last_validation = time.monotonic() - self._validating_since
            self._validation_seconds += self._last_validation
            self._validating_since = None

    def _plan(self, trainer: L.Trainer) -> str:
        """The estimate in words: the run's updates and epochs, and its minutes, left and in all."""
        total, step = run_updates(trainer), trainer.global_step
        per_epoch = updates_per_epoch(trainer)
        seconds = (total - step) * self._per_update
        if self._last_validation is not None:
            every = self.val_every or per_epoch
            validations = total // every - step // every
            seconds += validations * self._last_validation
            priced = (
                f"{validations} more validation{'' if validations == 1 else 's'} of "
                f"{self._last_validation:.1f} s each included"
            )
        else:
            priced = "validation not included until one has run"
        whole = (time.monotonic() - self._began + seconds) / 60
        return (
            f"Estimate from the updates timed so far: {total:,} updates ({total / per_epoch:.3g} "
            f"epochs of {per_epoch:,}), about {whole:.1f} min in all, {seconds / 60:.1f} min left "
            f"after update {step:,} ({priced})"
        )

    def _say(self, trainer: L.Trainer, line: str) -> None:
        if not trainer.is_global_zero:
            return
        bar = getattr(trainer.progress_bar_callback, "train_progress_bar", None)
        if bar is not None:
            bar.write(line)  # above the bar, which tqdm then redraws
        else:
            print(line)
