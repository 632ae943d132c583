"""The translation server's parts without a model: the batcher's grouping and its wait for the
clients of its last batch, model names, and a listening socket whose connections send without delay
(the server on the trained tiny checkpoint and its page in Chromium: tests/e2e/test_serve.py)."""

import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import pytest

from seq2seq.commands import serve
from seq2seq.serving.batcher import Batcher, Busy


def wait_until(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    """Poll `condition` until it holds; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def test_batcher_runs_same_settings_together_up_to_the_limit() -> None:
    calls, gate, entered = [], threading.Event(), threading.Event()

    def run(key: Any, items: list[Any], check: Any) -> list[Any]:
        calls.append((key, items))
        entered.set()
        assert gate.wait(20)
        return [f"{key}:{item}" for item in items]

    batcher = Batcher(run, max_batch=3, max_queue=5)
    try:
        first = batcher.submit("greedy", ["a"])
        assert entered.wait(20)  # the worker holds "a"; what follows waits in the queue
        later = [("greedy", ["b"]), ("beam5", ["c"]), ("greedy", ["d", "e"]), ("greedy", ["f"])]
        futures = [batcher.submit(key, items) for key, items in later]
        with pytest.raises(Busy):  # 5 sentences wait: the queue is full
            batcher.submit("greedy", ["g"])
        gate.set()
        assert futures[2].result(20) == ["greedy:d", "greedy:e"]
        assert first.result(20) == ["greedy:a"] and futures[1].result(20) == ["beam5:c"]
        assert [f.result(20) for f in (futures[0], futures[3])] == [["greedy:b"], ["greedy:f"]]
    finally:
        gate.set()
        batcher.close()
    # the oldest job first, with the later ones of its settings that fit; never mixed settings
    assert calls == [("greedy", ["a"]), ("greedy", ["b", "d", "e"]), ("beam5", ["c"]),
                     ("greedy", ["f"])]  # fmt: skip


def test_batcher_waits_for_the_clients_of_its_last_batch() -> None:
    """Three clients answered together come back one by one: after a batch of three the worker
    waits (a quarter of that batch's 1.2 s) for three, instead of running the first alone."""
    calls: list[list[str]] = []

    def run(key: Any, items: list[Any], check: Any) -> list[Any]:
        calls.append(items)
        time.sleep(1.2 if len(calls) == 1 else 0)
        return items

    batcher = Batcher(run, max_batch=8, max_queue=8)
    later: list[Future] = []

    def come_back(_: Future) -> None:  # in the worker, as soon as the first batch is answered
        later.append(batcher.submit("greedy", ["a"]))
        timer = threading.Timer(0.05, lambda: later.append(batcher.submit("greedy", ["b", "c"])))
        timer.start()

    try:
        batcher.submit("greedy", ["x", "y", "z"]).add_done_callback(come_back)
        wait_until(lambda: len(later) == 2 and all(f.done() for f in later))
        alone = batcher.submit("greedy", ["d"])  # the last batch took no time: nothing to wait for
        assert alone.result(20) == ["d"]
    finally:
        batcher.close()
    assert calls == [["x", "y", "z"], ["a", "b", "c"], ["d"]]


def test_model_names_are_file_stems_made_unique() -> None:
    paths = ["runs/a/best.ckpt", "runs/b/best.ckpt", "dot.ckpt", "best.ckpt"]
    assert serve.model_names(paths) == ["best", "best-2", "dot", "best-3"]


def test_connections_of_the_listening_socket_send_without_delay() -> None:
    # With Nagle's algorithm on, an answer's body waited behind its headers for the client's delayed
    # ACK: 40 ms a request on a keep-alive connection. asyncio turns it off on the connections it
    # accepts only when the listening socket says TCP.
    import asyncio

    sock = serve.listen("127.0.0.1", 0)
    accepted: list[int] = []

    class Probe(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            conn = transport.get_extra_info("socket")
            accepted.append(conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            transport.close()

    async def once() -> None:
        server = await asyncio.get_running_loop().create_server(Probe, sock=sock)
        reader, writer = await asyncio.open_connection(*sock.getsockname()[:2])
        await reader.read()  # until the server closes it
        writer.close()
        server.close()

    asyncio.run(asyncio.wait_for(once(), 30))
    assert accepted == [1]
