"""`seq2seq train` (and `python scripts/train.py`): parse the training flags, run
seq2seq.training.run.train, and turn its outcome into one line and an exit status (0 done, 2 bad
input, 3 diverged, 4 stopped politely)."""

import os
import sys
import time

from seq2seq.cli import cli_message
from seq2seq.errors import STOPPED, Stopped, TrainingDiverged, UserError
from seq2seq.signals import restoring
from seq2seq.training.config import parse_args
from seq2seq.training.run import STOP_SIGNALS, stop_message, train


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    # Training takes over the stop signals (seq2seq.training.stops); a caller in the same process (a test,
    # a notebook) gets its own handlers back however training ends.
    started = time.monotonic()  # --max-minutes counts from here: each process has its own budget
    with restoring(STOP_SIGNALS):
        try:
            cfg = parse_args(argv, prog)
            return train(cfg, started)
        except UserError as err:
            _print_error(err)
            return 2
        except TrainingDiverged as err:
            _print_error(err)
            return 3
        except Stopped as stop:
            if _rank_zero():
                print(stop_message(stop), file=sys.stderr)
            return STOPPED


def _rank_zero() -> bool:
    # DDP re-runs this command once per extra rank (LOCAL_RANK set); one message is enough.
    return os.environ.get("LOCAL_RANK", "0") == "0" and os.environ.get("NODE_RANK", "0") == "0"


def _print_error(err: Exception) -> None:
    if _rank_zero():
        print(f"error: {cli_message(err)}", file=sys.stderr)
