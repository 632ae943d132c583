"""Batching for the server: requests from many clients, queued and run together by one worker.

A model translates 16 sentences in one batch in little more time than one sentence alone, so the
server (seq2seq/serving/server.py) does not translate each request as it comes: it puts it in a queue,
and one worker thread per model takes the oldest request together with every queued request that
asks for the same thing (`key`: the same beam and n-best, or teacher-forced alignment) up to
`max_batch` sentences, and runs them as one call. Requests that ask for different settings are
never mixed, because one call of the model searches with one setting.

When the worker is free and fewer sentences wait than its last batch held, it waits a moment
(at most LINGER x that batch's run time) for the queue to refill to that size. Clients that send
their next request as soon as they have an answer come back together, but not all at once: without
the wait, the first one or two back were run alone, and the rest waited for them. With 16 clients
the server ran batches of 14-16 and of 1-2 in turn; with it, nearly all of 16 (docs/results/benchmarks.md).
One client sending alone never waits: its queue already holds as many as the batch before. A lone
request after a busy spell waits at most the LINGER share of the last batch's time, once.

The queue is bounded in sentences (`max_queue`) and in work (`max_queue_work`, summed `Cost.work`
of the waiting jobs): a request that would overflow it is refused at once with `Busy`, which the
server answers with 503, rather than left to wait without bound behind work the server cannot
finish in time. A batch is bounded the same way: the worker merges jobs only while their summed
cost stays within `max_cost` (the budget of one request), so many small requests never make one
call longer than the largest request the server takes. A request whose caller gave up (`abandon`)
is dropped from the queue unrun.

The batchers of a server run their batches on one thread (seq2seq.serving.server's TorchThread), so
they share one `Turns`: a worker takes its batch only once it has the turn, and runs it at once.
A batch taken first and run later would have its `max_seconds` spent on another model's run, and
a request for two models, each in time alone, would be stopped partway. So a model's jobs wait in
its queue while another model's batch runs, and count as queued all that time: a batch's clock
starts when it starts running, later jobs with its key can still join it, and a job that has
waited `max_seconds` for its turn is refused unrun then and there, as one that waited behind its
own model's batches is. Turns go first come, first served, so no model waits behind another's
steady traffic for more than one batch a model.

A running batch cannot be interrupted from outside, so `run` gets a `check` to call between the
model's steps: it raises `Stopped` once the batch has run `max_seconds` (TimedOut), once every job
in it has been abandoned (Abandoned), or once the server is shutting down (ShuttingDown). `stop`
refuses every queued job at once with ShuttingDown and makes the running batch's next check end it.
A job is thus answered within about twice `max_seconds` of being queued: at most that long waiting
(in the queue and for the turn), at most that long running.
"""

import threading
import time
from collections.abc import Callable, Hashable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from seq2seq.serving.budget import Cost

Check = Callable[[], None]  # raises Stopped to end the batch that calls it
# run(key, items, check) -> one output per item, in order: the model's work on one batch
Run = Callable[[Hashable, list[Any], Check], list[Any]]

# A batch that would be smaller than the one before waits for more requests, at most this fraction
# of the time the one before took (see the module docstring).
LINGER = 0.25


class Turns:
    """One batch at a time among the batchers that share this, in the order they asked for it (a
    ticket lock: a plain Lock lets a worker that has just let go take it again ahead of one that
    has been waiting)."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._next = self._serving = 0  # the next ticket given out; the ticket whose turn it is

    @contextmanager
    def turn(self, meanwhile: Callable[[], float | None] = lambda: None) -> Iterator[None]:
        """Wait for a turn and hold it for the `with` block. While waiting, call `meanwhile` now
        and then: it returns the seconds until it wants to be called again (None: not again
        unless woken); it runs without this object's lock."""
        with self._changed:
            ticket, self._next = self._next, self._next + 1
        again = meanwhile()
        while True:
            with self._changed:  # a turn passed on between the check and the wait wakes it
                if self._serving == ticket:
                    break
                self._changed.wait(again)
            again = meanwhile()
        try:
            yield
        finally:
            with self._changed:
                self._serving += 1
                self._changed.notify_all()


class Busy(Exception):
    """The queue has no room for a request: the caller should try again later."""


class Stopped(Exception):
    """A job that was not run to its end; the message says why, for the client."""


class TimedOut(Stopped):
    """Its batch ran past `max_seconds`."""


class Abandoned(Stopped):
    """Every client of its batch had gone."""


class ShuttingDown(Stopped):
    """The server is stopping: queued jobs are refused, the running batch is ended."""


@dataclass(eq=False)
class Job:
    """One request: its `items` (sentences, or (sentence, reference) pairs) share one `key`."""

    key: Hashable
    items: list[Any]
    cost: Cost = field(default_factory=Cost)
    future: Future = field(default_factory=Future)  # resolves to one output per item
    gone: bool = False  # its caller has given up (Batcher.abandon)
    since: float = field(default_factory=time.monotonic)  # when it was queued


class Batcher:
    """A bounded queue of jobs for one model and the thread that runs them in batches.

    Args:
        run: does the work of one batch; called in the worker thread only, so whatever it uses
            (a Translator) is never used by two threads at once.
        max_batch: the most items one call of `run` gets; a job may hold no more.
        max_queue: the most items waiting (not yet taken by the worker); at least `max_batch`, so
            every job fits into an empty queue.
        max_cost: the most one batch may cost (summed over its jobs); a job may cost no more.
            None: no bound.
        max_queue_work: the most `Cost.work` waiting; None: no bound.
        max_seconds: how long one batch may run, from when it starts, before its `check` raises
            TimedOut; and how long a job may wait in the queue (for its turn included) before it
            is refused with TimedOut unrun.
        turns: shared by the batchers whose `run`s share one thread (module docstring); None:
            this batcher's own.
    """

    def __init__(
        self, run: Run, max_batch: int, max_queue: int, name: str = "batcher",
        max_cost: Cost | None = None, max_queue_work: int | None = None,
        max_seconds: float = float("inf"), turns: Turns | None = None,
    ) -> None:  # fmt: skip
        if not 1 <= max_batch <= max_queue:
            raise ValueError(f"need 1 <= max_batch <= max_queue, got {max_batch}, {max_queue}")
        self.run, self.max_batch, self.max_queue = run, max_batch, max_queue
        self.max_cost, self.max_queue_work, self.max_seconds = max_cost, max_queue_work, max_seconds
        self._turns = turns or Turns()
        self._jobs: list[Job] = []  # oldest first
        self._queued = 0  # items in self._jobs
        self._queued_work = 0  # their summed Cost.work
        self._changed = threading.Condition()
        self._closed = False  # no new jobs; the worker ends once the queue is empty
        self._stopping = False  # the running batch ends at its next check
        self._running: list[Job] = []  # the batch being run
        self._worker = threading.Thread(target=self._work, name=name, daemon=True)
        self._worker.start()

    @property
    def queued(self) -> int:
        """Items waiting for the worker (a batch being run no longer counts)."""
        with self._changed:
            return self._queued

    def submit(self, key: Hashable, items: list[Any], cost: Cost | None = None) -> Future:
        """Queue `items` under `key`; the Future gives `run`'s outputs for them. Raises Busy when the
        queue has no room, ShuttingDown once stopped, ValueError for a job over `max_batch` or
        `max_cost`, or an empty one."""
        if not 1 <= len(items) <= self.max_batch:
            raise ValueError(f"a job holds 1 to {self.max_batch} items, got {len(items)}")
        job = Job(key, list(items), cost or Cost())
        if self.max_cost is not None and not _fits(job.cost, self.max_cost):
            raise ValueError(f"a job costs at most {self.max_cost}, got {job.cost}")
        with self._changed:
            if self._stopping:
                raise ShuttingDown("the server is shutting down")
            if self._closed:
                raise RuntimeError("the batcher is closed")
            if self._queued + len(items) > self.max_queue:
                waiting = f"{self._queued} of {self.max_queue} sentences already queued"
                raise Busy(f"{waiting}, no room for {len(items)} more")
            work = self._queued_work + job.cost.work
            if self.max_queue_work is not None and work > self.max_queue_work and self._jobs:
                waiting = f"{self._queued_work / 1e6:,.0f} ms of work already queued"
                raise Busy(f"{waiting}, no room for {job.cost.work / 1e6:,.0f} ms more")
            self._jobs.append(job)
            self._queued += len(items)
            self._queued_work += job.cost.work
            self._changed.notify()
        job.future.add_done_callback(lambda _: self._forget(job))
        return job.future

    def abandon(self, future: Future) -> None:
        """Its caller has gone: a queued job leaves the queue; a running one counts as gone, and a
        batch whose jobs have all gone ends at its next check."""
        with self._changed:
            for job in self._running:
                if job.future is future:
                    job.gone = True
        future.cancel()  # a job still queued: cancelled, and _forget takes it out

    def stop(self) -> None:
        """Refuse new jobs and every queued one (ShuttingDown), and end the running batch at its
        next check. Safe from any thread (a signal handler's included)."""
        with self._changed:
            self._closed = self._stopping = True
            refused, self._jobs, self._queued, self._queued_work = self._jobs, [], 0, 0
            self._changed.notify()
        for job in refused:
            if job.future.set_running_or_notify_cancel():
                job.future.set_exception(ShuttingDown("the server is shutting down"))

    def close(self, timeout: float = 10.0) -> None:
        """Refuse new jobs, let the worker finish the queued ones, and wait for it (`timeout` s)."""
        with self._changed:
            self._closed = True
            self._changed.notify()
        self._worker.join(timeout)

    def _forget(self, job: Job) -> None:
        """A job cancelled while it waits leaves the queue at once, making room for others."""
        if job.future.cancelled():
            with self._changed:
                if job in self._jobs:
                    self._jobs.remove(job)
                    self._queued -= len(job.items)
                    self._queued_work -= job.cost.work

    def _work(self) -> None:
        last_size, last_seconds = 0, 0.0  # the batch before: its sentences and its run time
        while True:
            with self._changed:
                while not self._jobs and not self._closed:
                    self._changed.wait()
                if not self._jobs:  # closed and drained
                    return
                deadline = time.monotonic() + LINGER * last_seconds
                while self._queued < min(last_size, self.max_batch) and not self._closed:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._changed.wait(left)
            with self._turns.turn(self._expire):  # what is taken now runs at once
                batch = self._take()
                with self._changed:
                    self._running = batch
                if batch:
                    start = time.monotonic()  # the batch's max_seconds count from here
                    self._run(batch, start)
                    with self._changed:
                        self._running = []
                    last_size = sum(len(job.items) for job in batch)
                    last_seconds = time.monotonic() - start

    def _expire(self) -> float | None:
        """Refuse the jobs that have waited past `max_seconds` (rather than run them late); the
        seconds until the next one would have (None: never). While the worker waits for its turn
        it calls this now and then, so a job refused there hears so when it expires."""
        if self.max_seconds == float("inf"):
            return None
        with self._changed:
            now, expired, waiting = time.monotonic(), [], []
            for job in self._jobs:
                (expired if now - job.since > self.max_seconds else waiting).append(job)
            for job in expired:
                self._queued -= len(job.items)
                self._queued_work -= job.cost.work
            self._jobs = waiting
            oldest = min((job.since for job in waiting), default=now)  # a job queued later: later
        for job in expired:
            if job.future.set_running_or_notify_cancel():
                job.future.set_exception(TimedOut(
                    f"the request waited past {self.max_seconds:g} s (--max-seconds) for the "
                    "model and was not run: try again when it is less busy"
                ))  # fmt: skip
        return max(oldest + self.max_seconds - now, 0.0) + 0.001  # a moment past it: expired

    def _take(self) -> list[Job]:
        """Remove and return the oldest job and the later ones with its key, up to `max_batch`
        items and `max_cost`; jobs cancelled while they waited are removed and left out, and
        those that waited past `max_seconds` (for the turn included) are refused. Holds the turn."""
        self._expire()
        with self._changed:
            return self._oldest_batch()

    def _oldest_batch(self) -> list[Job]:
        """`_take`'s batch from the jobs left. Holds the lock."""
        if not self._jobs:
            return []
        key, size, cost, taken, left = self._jobs[0].key, 0, Cost(), [], []
        for job in self._jobs:
            fits = job.key == key and size + len(job.items) <= self.max_batch
            fits = fits and (
                not taken or self.max_cost is None or _fits(cost + job.cost, self.max_cost)
            )
            if fits or job.future.cancelled():
                self._queued -= len(job.items)
                self._queued_work -= job.cost.work
                if job.future.set_running_or_notify_cancel():  # False: cancelled, drop it
                    taken.append(job)
                    size += len(job.items)
                    cost += job.cost
            else:
                left.append(job)
        self._jobs = left
        return taken

    def _check(self, batch: list[Job], start: float) -> Check:
        """The `check` one batch's `run` calls between steps (module docstring)."""
        deadline = start + self.max_seconds

        def check() -> None:
            if self._stopping:
                raise ShuttingDown("the server is shutting down")
            if all(job.gone for job in batch):
                raise Abandoned("every client of this batch has gone")
            if time.monotonic() > deadline:
                raise TimedOut(
                    f"the model's batch ran past {self.max_seconds:g} s (--max-seconds) and was "
                    "stopped: send fewer or shorter sentences, or try again when it is less busy"
                )

        return check

    def _run(self, batch: list[Job], start: float) -> None:
        """One call of `run` for the jobs of `batch`; its outputs (or its error) go to each job."""
        items = [item for job in batch for item in job.items]
        try:
            outputs = self.run(batch[0].key, items, self._check(batch, start))
        except Exception as err:  # the worker outlives any one batch; its callers get the error
            for job in batch:
                job.future.set_exception(err)
            return
        start = 0
        for job in batch:
            job.future.set_result(outputs[start : start + len(job.items)])
            start += len(job.items)


def _fits(cost: Cost, most: Cost) -> bool:
    return cost.work <= most.work and cost.memory <= most.memory
