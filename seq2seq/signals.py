"""Taking over signals for a while: the one helper behind every stop handler and every parent that
passes a scheduler's stop on to its children (train.py, PoliteStop, the study's runs and scoring).
"""

import contextlib
import signal
import subprocess
from collections.abc import Callable, Collection, Iterable, Iterator
from types import FrameType

Handler = Callable[[int, FrameType | None], object]
STOPS = (signal.SIGTERM, signal.SIGUSR1)  # what a scheduler sends before it kills


@contextlib.contextmanager
def restoring(signals: Iterable[int]) -> Iterator[dict]:
    """The handlers of `signals` as they are now come back after the block, however it ends and
    whatever it installed meanwhile. Yields them, by signal."""
    previous = {signum: signal.getsignal(signum) for signum in signals}
    try:
        yield previous
    except GeneratorExit:
        # Dropped without being exited (its owner forgot to close it, and the garbage collector
        # closes it now): putting the old handlers back at whatever moment that happens would take
        # the signals away from whoever handles them by then, such as a later run in this process.
        raise
    except BaseException:
        _put_back(previous)
        raise
    _put_back(previous)


def _put_back(handlers: dict) -> None:
    for signum, handler in handlers.items():
        signal.signal(signum, handler)


@contextlib.contextmanager
def held(signals: Iterable[int]) -> Iterator[None]:
    """Block `signals` inside the block (this thread); one that comes meanwhile is delivered, to
    whatever handler is then in place, as the block ends."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, list(signals))
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def default_stops() -> None:
    """In a child between fork and exec (a `preexec_fn`): the stop signals get their default action
    and are unblocked, so a child started under `held(STOPS)` does not keep them blocked."""
    for signum in STOPS:
        signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS)


@contextlib.contextmanager
def handling(signals: Iterable[int], handler: Handler | int) -> Iterator[dict]:
    """Install `handler` for `signals` inside the block; the previous handlers come back after it.
    Yields those previous handlers, by signal."""
    signals = list(signals)
    with restoring(signals) as previous:
        for signum in signals:
            signal.signal(signum, handler)
        yield previous


@contextlib.contextmanager
def forwarding(
    children: Collection[subprocess.Popen],
    signals: Iterable[int] = STOPS,
    then: Callable[[int], None] | None = None,
) -> Iterator[Callable[[subprocess.Popen], None]]:
    """Pass `signals` on to every child in `children` (a live collection: children started inside
    the block are included) while the block runs, so each stops in its own way; `then(signum)` is
    called after, for the caller to note the stop.

    Yields `joined(child)`, to call once a child started in the block is in `children`: a signal that
    came while it was being started (after Popen, before it was added) reaches it too.
    """
    received: list[int] = []

    def forward(signum: int, frame: FrameType | None) -> None:
        received.append(signum)
        for child in list(children):
            if child.poll() is None:
                child.send_signal(signum)
        if then is not None:
            then(signum)

    def joined(child: subprocess.Popen) -> None:
        if received and child.poll() is None:
            child.send_signal(received[0])  # a second copy, if it raced the forward, is harmless

    with handling(signals, forward):
        yield joined


def wait_forwarding(process: subprocess.Popen, signals: Iterable[int] = STOPS) -> int:
    """Wait for `process`, passing `signals` on to it; returns its exit status."""
    with forwarding([process], signals):
        return process.wait()
