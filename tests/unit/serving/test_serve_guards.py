"""The server's guards without a model: batches and queues bounded in work, a batch past its
deadline, batchers that share one thread taking turns, the Host names and a stop that refuses
queued jobs (against what an attacker sends, on
the trained tiny checkpoint, and SIGTERM to a server process: tests/e2e/test_serve_guards.py).

Nothing here measures time: work is counted (the model's steps, through the `check` every search
step calls) and states are waited for (gates, markers); every wait has a deadline. The deadlines
under test are in seconds, so those tests hold a batch for a set time, with margins of a third of
a deadline or more either side.
"""

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from seq2seq.serving.batcher import Batcher, Busy, ShuttingDown, TimedOut, Turns
from seq2seq.serving.budget import Cost
from seq2seq.serving.hosts import host_name, known_names
from tests.unit.serving.test_serve import wait_until


def test_batches_and_queue_are_bounded_in_work() -> None:
    """Jobs of 4 units under a batch budget of 10: two a batch; a queue of 10 units takes two more
    and refuses the third while the worker is held."""
    calls, gate, entered = [], threading.Event(), threading.Event()

    def run(key: Any, items: list[Any], check: Any) -> list[Any]:
        calls.append(items)
        entered.set()
        assert gate.wait(20)
        return items

    batcher = Batcher(run, 32, 64, max_cost=Cost(10, 10), max_queue_work=10)
    four = Cost(4, 1)
    try:
        first = batcher.submit("k", ["a"], four)
        assert entered.wait(20)
        waiting = [batcher.submit("k", [x], four) for x in "bc"]
        with pytest.raises(Busy, match="ms of work already queued"):
            batcher.submit("k", ["d"], four)
        with pytest.raises(ValueError, match="a job costs at most"):
            batcher.submit("k", ["e"], Cost(11, 1))
        gate.set()
        assert [f.result(20) for f in (first, *waiting)] == [["a"], ["b"], ["c"]]
        gate.clear()
        entered.clear()
        held = batcher.submit("k", ["f"], four)  # holds the worker again
        assert entered.wait(20)
        three = [batcher.submit("k", [x], Cost(3, 1)) for x in "ghi"]  # 9 units queued
        gate.set()
        assert [f.result(20) for f in (held, *three)] == [["f"], ["g"], ["h"], ["i"]]
    finally:
        gate.set()
        batcher.close()
    # 4 + 4 fit a batch of 10 and a third would not; 3 + 3 + 3 fit one
    assert calls == [["a"], ["b", "c"], ["f"], ["g", "h", "i"]]


def test_batch_past_its_deadline_ends_at_its_next_step_and_queued_jobs_expire() -> None:
    """The check raises TimedOut once the batch has run max_seconds; a job that waited longer
    than that is refused unrun."""
    steps: list[int] = []

    waited = threading.Event()

    def run(key: Any, items: list[Any], check: Any) -> list[Any]:
        steps.append(1)
        assert waited.wait(20)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # a search that would go on: one check a step
            check()
            time.sleep(0.01)
        return items

    batcher = Batcher(run, 4, 8, max_seconds=0.3)
    try:
        first = batcher.submit("k", ["a"])
        wait_until(lambda: len(steps) > 0)  # running: what comes now waits in the queue
        second = batcher.submit("other", ["b"])
        time.sleep(0.4)  # at least this long: the batch and the queued job are both past 0.3 s
        waited.set()
        with pytest.raises(TimedOut, match="--max-seconds"):
            first.result(20)
        with pytest.raises(TimedOut, match="waited past 0.3 s"):
            second.result(20)
    finally:
        batcher.close()


def test_batchers_sharing_a_thread_take_turns_and_a_batch_gets_its_seconds_when_it_runs() -> None:
    """Two models' batches run on one thread, as the server's do. While the first model's batch
    runs, the second's jobs stay queued (and go into one batch). That batch then runs for most of
    max_seconds and is answered, though it was queued most of max_seconds before: the time it
    waited for the thread is queue time, not its own. A job that waits for its turn past
    max_seconds is refused unrun, as soon as it has (the first model still holding the thread)."""
    most = 1.2  # max_seconds
    thread = ThreadPoolExecutor(1)  # every batch of both models runs here
    gate, entered, calls = threading.Event(), threading.Event(), []

    def held(key: Any, items: list[Any], check: Any) -> list[Any]:  # the first model
        calls.append(("first", items))
        entered.set()
        assert gate.wait(20)  # no check while held: it is answered whenever the gate opens
        return items

    def steps(key: Any, items: list[Any], check: Any) -> list[Any]:  # the second: a search
        calls.append(("second", items))
        end = time.monotonic() + most / 2
        while time.monotonic() < end:  # one check a step, for half of max_seconds
            check()
            time.sleep(0.01)
        return items

    def on_thread(work: Any) -> Any:
        return lambda key, items, check: thread.submit(work, key, items, check).result()

    turns = Turns()
    first = Batcher(on_thread(held), 4, 8, max_seconds=most, turns=turns)
    second = Batcher(on_thread(steps), 4, 8, max_seconds=most, turns=turns)
    try:
        a = first.submit("k", ["a"])
        assert entered.wait(20)
        b, c = second.submit("k", ["b"]), second.submit("k", ["c"])
        time.sleep(most / 2)  # b and c wait half of max_seconds for the first model's batch
        assert second.queued == 2  # neither taken while the thread is the first model's
        gate.set()
        assert a.result(20) == ["a"]
        assert b.result(20) == ["b"] and c.result(20) == ["c"]  # ran another half: answered
        assert calls == [("first", ["a"]), ("second", ["b", "c"])]
        gate.clear()
        entered.clear()
        a = first.submit("k", ["a"])
        assert entered.wait(20)
        late = second.submit("k", ["d"])
        with pytest.raises(TimedOut, match=f"waited past {most:g} s"):
            late.result(20)  # d waits past max_seconds for its turn
        assert not a.done()  # refused while the first model's batch still held the thread
        gate.set()
        assert a.result(20) == ["a"]
        assert calls[2:] == [("first", ["a"])]  # d was never run
    finally:
        gate.set()
        first.close()
        second.close()
        thread.shutdown()


def test_turns_go_in_the_order_asked() -> None:
    """A worker that lets go of the turn and asks again at once goes after the one already
    waiting (a plain Lock would most often give it straight back)."""
    turns, order = Turns(), []

    def take() -> None:
        with turns.turn():
            order.append("waiting")

    with turns.turn():
        worker = threading.Thread(target=take)
        worker.start()
        wait_until(lambda: turns._next == 2)  # the worker has its ticket
    with turns.turn():  # let go, and ask again at once
        order.append("again")
    worker.join(20)
    assert order == ["waiting", "again"]


def test_host_names() -> None:
    assert host_name("127.0.0.1:8000") == "127.0.0.1" and host_name("[::1]:80") == "[::1]"
    assert host_name("LocalHost") == "localhost" and host_name("example.org") == "example.org"
    names = known_names("::1", ("example.org",))
    assert {"localhost", "127.0.0.1", "[::1]", "example.org"} <= names
    assert "0.0.0.0" in known_names("0.0.0.0") and "evil.example" not in names


def test_stop_refuses_queued_jobs_at_once_and_ends_the_running_batch() -> None:
    entered = threading.Event()

    def run(key: Any, items: list[Any], check: Any) -> list[Any]:
        entered.set()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            check()
            time.sleep(0.01)
        return items

    batcher = Batcher(run, 4, 8)
    first = batcher.submit("k", ["a"])
    assert entered.wait(20)
    queued = batcher.submit("k", ["b"])
    batcher.stop()
    with pytest.raises(ShuttingDown):
        queued.result(0)  # refused by stop itself, not later
    with pytest.raises(ShuttingDown):
        first.result(20)
    with pytest.raises(ShuttingDown):
        batcher.submit("k", ["c"])
    batcher.close(20)
