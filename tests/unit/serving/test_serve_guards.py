"""The server against what an attacker sends and against its own stop: adversarial text, batches and
queues bounded in work, deadlines, clients that leave mid-batch, the Host check and a stop (SIGTERM
to a server process: tests/e2e/test_serve_guards.py).

Nothing here measures time: work is counted (the model's steps, through the `check` every search
step calls) and states are waited for (gates, markers); every wait has a deadline.
"""

import gc
import http.client
import json
import logging
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from seq2seq.decoding.translator import Translator
from seq2seq.serving.batcher import Abandoned, Batcher, Busy, ShuttingDown, TimedOut
from seq2seq.serving.budget import Cost
from seq2seq.serving.hosts import host_name, known_names
from seq2seq.serving.requests import Limits
from tests.unit.serving.test_serve import call, exchange, live_server, serve, served_app, wait_until

ATTACK = "aA" * 500  # about one subword a character, here as in the shared tokenizer


class StepCounting(Translator):
    """Counts the search steps (each calls `check`) and the calls of translate and align."""

    def __init__(self, loaded: Translator) -> None:
        super().__init__(loaded.model, loaded.tokenizer)
        self.steps, self.calls = 0, 0

    def _counted(self, check: Any) -> Any:
        def counted() -> None:
            self.steps += 1
            if check is not None:
                check()

        return counted

    def translate(self, *args: Any, check: Any = None, **kwargs: Any) -> Any:
        self.calls += 1
        return super().translate(*args, check=self._counted(check), **kwargs)

    def align(self, *args: Any, check: Any = None, **kwargs: Any) -> Any:
        self.calls += 1
        return super().align(*args, check=self._counted(check), **kwargs)


@pytest.fixture(scope="module")
def loaded(tiny_checkpoint: Path) -> Translator:
    return Translator.load(tiny_checkpoint)


ADVERSARIAL = {
    "greedy x1": ("/api/translate", {"sentences": [ATTACK], "beam": 1}),
    "greedy x6": ("/api/translate", {"sentences": [ATTACK] * 6, "beam": 1}),
    "beam 11": ("/api/translate", {"sentences": [ATTACK], "beam": 11, "nbest": 11}),
    "align x9": ("/api/align", {"sentences": [ATTACK] * 9, "references": [ATTACK] * 9}),
}


@pytest.mark.parametrize("case", ADVERSARIAL.values(), ids=ADVERSARIAL)
def test_adversarial_text_is_answered_within_the_output_cap_or_refused_unrun(
    loaded: Translator, case: tuple[str, dict]
) -> None:
    """At the default limits: an answer whose outputs stop at --max-output (the search ran no more
    steps than that per batch), or a 413 with the model never called. With a budget of 1 ms, the
    same request is refused unrun."""
    path, body = case
    limits = Limits()
    assert len(loaded.tokenizer.encode(ATTACK)) > 2 * limits.max_output  # the cap is what binds
    model = StepCounting(loaded)
    with live_server({"gru": model}, limits) as base:
        status, answer = call(base, path, body)
    assert status in (200, 413), answer
    if status == 413:
        assert model.calls == 0 and "--max-work" in answer["error"]
    else:
        for result in answer["results"]["gru"]:
            if path == "/api/translate":
                assert len(result["tgt_tokens"]) <= limits.max_output
                cut = [w for w in answer["warnings"] if "--max-output" in w]
                assert len(result["tgt_tokens"]) < limits.max_output or cut
        batches = -(-len(body["sentences"]) * len(ATTACK) // 4096) + 1
        bound = limits.max_output if path == "/api/translate" else 1
        assert model.calls == 1 and model.steps <= bound * batches
    small = StepCounting(loaded)
    with live_server({"gru": small}, Limits(max_work=1)) as base:
        status, answer = call(base, path, body)
    assert status == 413 and small.calls == 0 and "--max-work" in answer["error"]


def test_output_cap_ends_outputs_with_a_warning(loaded: Translator) -> None:
    limits = Limits(max_output=7)
    with live_server({"gru": loaded}, limits) as base:
        status, answer = call(base, "/api/translate", {"sentences": [ATTACK], "beam": 3})
    [result] = answer["results"]["gru"]
    assert status == 200 and len(result["tgt_tokens"]) <= 7
    if len(result["tgt_tokens"]) == 7:  # reached the cap: the answer says so
        assert answer["warnings"] == [
            "gru: sentences[0]: the output was cut at 7 subwords (--max-output)"
        ]


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


def test_batch_whose_clients_all_left_is_cancelled(loaded: Translator) -> None:
    """A client that disconnects while its request is being decoded: the batch ends at its next
    check (Abandoned) instead of decoding for nobody; later requests are served."""
    ended: Future = Future()
    started = threading.Event()

    class Held(Translator):
        def translate(self, *args: Any, check: Any = None, **kwargs: Any) -> Any:
            started.set()
            deadline = time.monotonic() + 20
            try:
                while time.monotonic() < deadline:  # decoding, one check a step
                    check()
                    time.sleep(0.01)
            except Abandoned as err:
                ended.set_result(err)
                raise
            ended.set_result(None)
            return super().translate(*args, check=check, **kwargs)

    model = Held(loaded.model, loaded.tokenizer)
    with live_server({"gru": model}, Limits(max_seconds=60)) as base:
        host, port = base.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        body = json.dumps({"sentences": ["Ein Hund"]})
        conn.request("POST", "/api/translate", body, {"Content-Type": "application/json"})
        assert started.wait(20)
        conn.close()  # the client leaves mid-decode
        assert isinstance(ended.result(30), Abandoned)
        model.translate = Translator.translate.__get__(model)  # serve normally from now on
        assert call(base, "/api/translate", {"sentences": ["Ein Hund"]})[0] == 200


def test_host_names() -> None:
    assert host_name("127.0.0.1:8000") == "127.0.0.1" and host_name("[::1]:80") == "[::1]"
    assert host_name("LocalHost") == "localhost" and host_name("example.org") == "example.org"
    names = known_names("::1", ("example.org",))
    assert {"localhost", "127.0.0.1", "[::1]", "example.org"} <= names
    assert "0.0.0.0" in known_names("0.0.0.0") and "evil.example" not in names


def test_foreign_host_gets_a_one_line_400(loaded: Translator) -> None:
    good = {"sentences": ["Ein Hund"]}
    with live_server({"gru": loaded}, Limits()) as base:
        port = base.rsplit(":", 1)[1]
        for host in ("evil.example", f"evil.example:{port}", "127.0.0.2", ""):
            status, headers, raw = exchange(base, "/api/translate", good, Host=host)
            answer = json.loads(raw)
            assert status == 400 and list(answer) == ["error"], (host, raw)
            assert "--allow-host" in answer["error"] and "\n" not in answer["error"]
            assert headers["content-type"] == "application/json"
            assert exchange(base, "/", Host=host)[0] == 400  # the page too
        for host in ("localhost", f"localhost:{port}", f"127.0.0.1:{port}", "LOCALHOST"):
            assert exchange(base, "/api/translate", good, Host=host)[0] == 200, host


def test_allow_host_flag_adds_a_name(
    tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[tuple[Any, Any]] = []
    monkeypatch.setattr(serve, "run", lambda app, sock, level: started.append((app, sock)))
    argv = [str(tiny_checkpoint), "--port", "0", "--allow-host", "translate.example"]
    assert serve.main(argv) == 0
    [(app, sock)] = started
    good = {"sentences": ["Ein Hund"]}
    with served_app(app, sock) as base:
        assert exchange(base, "/api/translate", good, Host="translate.example")[0] == 200
        assert exchange(base, "/api/translate", good, Host="other.example")[0] == 400


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


def test_client_that_leaves_logs_no_asyncio_error(
    loaded: Translator, caplog: pytest.LogCaptureFixture
) -> None:
    """A client gone mid-batch (the batch ends Abandoned) leaves nothing in the asyncio log."""
    started = threading.Event()

    class Held(Translator):
        def translate(self, *args: Any, check: Any = None, **kwargs: Any) -> Any:
            started.set()
            while True:
                check()
                time.sleep(0.01)

    model = Held(loaded.model, loaded.tokenizer)
    with caplog.at_level(logging.ERROR), live_server({"gru": model}, Limits()) as base:
        host, port = base.removeprefix("http://").split(":")
        for _ in range(3):
            started.clear()
            conn = http.client.HTTPConnection(host, int(port), timeout=10)
            body = json.dumps({"sentences": ["Ein Hund"]})
            conn.request("POST", "/api/translate", body, {"Content-Type": "application/json"})
            assert started.wait(20)
            conn.close()
            wait_until(lambda: call(base, "/api/models")[1]["models"][0]["queued"] == 0)
        status, answer = call(base, "/api/models")
        assert status == 200
        gc.collect()  # an asyncio future left with an unread error logs it when collected
    assert not [r for r in caplog.records if r.name == "asyncio"], caplog.text
