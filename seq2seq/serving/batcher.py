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

The queue is bounded in sentences (`max_queue`): a request that would overflow it is refused at
once with `Busy`, which the server answers with 503, rather than left to wait without bound behind
work the server cannot finish in time. A request whose caller gave up (its `Future` cancelled, say
because the client disconnected) is dropped from the queue unrun.
"""

import threading
import time
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

# run(key, items) -> one output per item, in order: the model's work on one batch
Run = Callable[[Hashable, list[Any]], list[Any]]

# A batch that would be smaller than the one before waits for more requests, at most this fraction
# of the time the one before took (see the module docstring).
LINGER = 0.25


class Busy(Exception):
    """The queue has no room for a request: the caller should try again later."""


@dataclass(eq=False)
class Job:
    """One request: its `items` (sentences, or (sentence, reference) pairs) share one `key`."""

    key: Hashable
    items: list[Any]
    future: Future = field(default_factory=Future)  # resolves to one output per item


class Batcher:
    """A bounded queue of jobs for one model and the thread that runs them in batches.

    Args:
        run: does the work of one batch; called in the worker thread only, so whatever it uses
            (a Translator) is never used by two threads at once.
        max_batch: the most items one call of `run` gets; a job may hold no more.
        max_queue: the most items waiting (not yet taken by the worker); at least `max_batch`, so
            every job fits into an empty queue.
    """

    def __init__(self, run: Run, max_batch: int, max_queue: int, name: str = "batcher") -> None:
        if not 1 <= max_batch <= max_queue:
            raise ValueError(f"need 1 <= max_batch <= max_queue, got {max_batch}, {max_queue}")
        self.run, self.max_batch, self.max_queue = run, max_batch, max_queue
        self._jobs: list[Job] = []  # oldest first
        self._queued = 0  # items in self._jobs
        self._changed = threading.Condition()
        self._closed = False
        self._worker = threading.Thread(target=self._work, name=name, daemon=True)
        self._worker.start()

    @property
    def queued(self) -> int:
        """Items waiting for the worker (a batch being run no longer counts)."""
        with self._changed:
            return self._queued

    def submit(self, key: Hashable, items: list[Any]) -> Future:
        """Queue `items` under `key`; the Future gives `run`'s outputs for them. Raises Busy when the
        queue has no room, ValueError for a job over `max_batch` or an empty one."""
        if not 1 <= len(items) <= self.max_batch:
            raise ValueError(f"a job holds 1 to {self.max_batch} items, got {len(items)}")
        job = Job(key, list(items))
        with self._changed:
            if self._closed:
                raise RuntimeError("the batcher is closed")
            if self._queued + len(items) > self.max_queue:
                waiting = f"{self._queued} of {self.max_queue} sentences already queued"
                raise Busy(f"{waiting}, no room for {len(items)} more")
            self._jobs.append(job)
            self._queued += len(items)
            self._changed.notify()
        job.future.add_done_callback(lambda _: self._forget(job))
        return job.future

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
                batch = self._take()
            if batch:
                start = time.monotonic()
                self._run(batch)
                last_size = sum(len(job.items) for job in batch)
                last_seconds = time.monotonic() - start

    def _take(self) -> list[Job]:
        """Remove and return the oldest job and the later ones with its key, up to `max_batch`
        items; jobs cancelled while they waited are removed and left out. Holds the lock."""
        key, size, taken, left = self._jobs[0].key, 0, [], []
        for job in self._jobs:
            fits = job.key == key and size + len(job.items) <= self.max_batch
            if fits or job.future.cancelled():
                self._queued -= len(job.items)
                if job.future.set_running_or_notify_cancel():  # False: cancelled, drop it
                    taken.append(job)
                    size += len(job.items)
            else:
                left.append(job)
        self._jobs = left
        return taken

    def _run(self, batch: list[Job]) -> None:
        """One call of `run` for the jobs of `batch`; its outputs (or its error) go to each job."""
        items = [item for job in batch for item in job.items]
        try:
            outputs = self.run(batch[0].key, items)
        except Exception as err:  # the worker outlives any one batch; its callers get the error
            for job in batch:
                job.future.set_exception(err)
            return
        start = 0
        for job in batch:
            job.future.set_result(outputs[start : start + len(job.items)])
            start += len(job.items)
