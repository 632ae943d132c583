"""PoliteStop: the stop signal is the flag's, SIGTERM always stops, and the handlers come back
(polite stops of training runs with real signals: tests/e2e/test_stops.py)."""

import os
import signal
from pathlib import Path


def test_the_stop_signal_is_the_flag_s_and_sigterm_always_stops(tmp_path: Path) -> None:
    from seq2seq.training.stops import PoliteStop

    stop = PoliteStop(tmp_path, "USR2")
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGUSR2)}
    stop.install()
    try:
        os.kill(os.getpid(), signal.SIGUSR2)  # noted, not acted on: the training loop acts
        assert stop.requested == "stopped by SIGUSR2"
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.requested == "stopped by SIGUSR2"  # the first reason is kept
    finally:
        stop.restore()
    assert {sig: signal.getsignal(sig) for sig in handlers} == handlers
