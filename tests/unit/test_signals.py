"""seq2seq.signals: handlers given back after a block, stops passed on to children, including one
that came while a child was being started."""

import gc
import os
import signal
import subprocess
import sys

from seq2seq.signals import forwarding, handling, restoring

# Exits 7 on SIGTERM once it has said it is ready; 0 if nothing comes within 30 s.
CHILD = ("import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(7)); "
         "print('ready', flush=True); time.sleep(30)")  # fmt: skip


def ready_child() -> subprocess.Popen:
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    return child


def test_handlers_come_back_however_the_block_ends() -> None:
    before = signal.getsignal(signal.SIGUSR1)
    noted = []
    try:
        with handling([signal.SIGUSR1], lambda signum, frame: noted.append(signum)):
            os.kill(os.getpid(), signal.SIGUSR1)
            raise RuntimeError("the block fails")
    except RuntimeError:
        pass
    assert noted == [signal.SIGUSR1] and signal.getsignal(signal.SIGUSR1) is before
    with restoring([signal.SIGUSR1]):
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    assert signal.getsignal(signal.SIGUSR1) is before


def test_a_block_dropped_without_exit_leaves_later_handlers_alone() -> None:
    noted = []
    with handling([signal.SIGUSR1], lambda signum, frame: noted.append("first")):
        forgotten = handling([signal.SIGUSR1], signal.SIG_IGN)
        forgotten.__enter__()  # entered, never exited: its owner stopped early
        with handling([signal.SIGUSR1], lambda signum, frame: noted.append("later")):
            del forgotten
            gc.collect()  # the dropped block is closed now, in the middle of the later one
            os.kill(os.getpid(), signal.SIGUSR1)
    assert noted == ["later"]


def test_a_stop_reaches_children_at_work_and_one_started_after_it() -> None:
    children: list[subprocess.Popen] = []
    noted, before = [], signal.getsignal(signal.SIGTERM)
    with forwarding(children, then=noted.append) as joined:
        first = ready_child()
        children.append(first)
        joined(first)  # no stop yet: nothing is sent
        assert first.poll() is None
        late = ready_child()  # being started when the stop comes: not yet among the children
        os.kill(os.getpid(), signal.SIGTERM)
        assert first.wait(10) == 7 and late.poll() is None
        children.append(late)
        joined(late)
        assert late.wait(10) == 7
    assert noted == [signal.SIGTERM] and signal.getsignal(signal.SIGTERM) is before
