"""The exceptions that scripts turn into one line and an exit status of their own."""

from pathlib import Path


class UserError(Exception):
    """Bad input (a file, a line, a flag). Scripts print its message on one line and exit with status 2."""


class TrainingDiverged(Exception):
    """The loss or its gradients became NaN or infinite. Scripts print the message on one line and exit
    with status 3 (not 2: the input was fine, the optimisation was not)."""


STOPPED = 4  # the exit status of a polite stop: not trained to the end; `--resume` continues


class Stopped(Exception):
    """Training stopped politely (a scheduler's signal, or `--max-minutes`) on an update boundary.
    Scripts print one line naming the checkpoint that holds every finished update, and exit with
    status `STOPPED`. `step` None: stopped before training began, nothing new to save."""

    def __init__(self, reason: str, step: int | None, checkpoint: Path | None) -> None:
        super().__init__(reason)
        self.reason, self.step, self.checkpoint = reason, step, checkpoint
