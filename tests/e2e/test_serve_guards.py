"""The server on the trained tiny checkpoint against what an attacker sends and against its own stop:
adversarial text, output caps, clients that leave mid-batch, the Host check and SIGTERM to a server
process (the bounds and the stop without a model: tests/unit/serving/test_serve_guards.py).

Nothing here measures time: work is counted (the model's steps, through the `check` every search
step calls) and states are waited for (gates, markers); every wait has a deadline. The one test of
`--max-seconds` holds each model for a set time, with margins of a third of a deadline or more.
"""

import gc
import http.client
import json
import logging
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from seq2seq.decoding.translator import Translator
from seq2seq.serving.batcher import Abandoned
from seq2seq.serving.requests import Limits
from tests.conftest import ROOT
from tests.e2e.test_serve import call, exchange, live_server, serve, served_app
from tests.unit.serving.test_serve import wait_until

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


def test_request_for_two_models_each_in_time_alone_is_answered(loaded: Translator) -> None:
    """Two models, each searching for over half of --max-seconds: one thread runs both, so the
    second model's batch waits for the first's. Its --max-seconds count from when it starts to
    run, so the request for both is answered (it was stopped with 503 "ran past" when they counted
    from when its worker took it, before the wait)."""
    most = 1.2  # --max-seconds
    runs: list[str] = []

    class Slow(Translator):
        def __init__(self, name: str) -> None:
            super().__init__(loaded.model, loaded.tokenizer)
            self.name = name

        def translate(self, *args: Any, check: Any = None, **kwargs: Any) -> Any:
            runs.append(self.name)
            end = time.monotonic() + 0.6 * most
            while time.monotonic() < end:  # a search's steps, one check each
                check()
                time.sleep(0.01)
            return super().translate(*args, check=check, **kwargs)

    models = {name: Slow(name) for name in ("first", "second")}
    body = {"sentences": ["Ein Hund läuft im Park"], "beam": 2}
    with live_server(models, Limits(max_seconds=most)) as base:
        for name in models:  # each alone, in time
            assert call(base, "/api/translate", {**body, "models": [name]})[0] == 200
        status, answer = call(base, "/api/translate", body)  # both: the page's default
    assert status == 200, answer
    assert list(answer["results"]) == ["first", "second"]
    assert sorted(runs[2:]) == ["first", "second"]  # each ran once, to its end, in either order


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


CHILD = """
import sys, threading, time
from seq2seq.decoding.translator import Translator
from seq2seq.serving.requests import Limits
from seq2seq.serving.server import build_app
from tests.e2e.test_serve import serve

class Endless(Translator):  # a decode that would run for minutes, one check a step
    def translate(self, *args, check=None, **kwargs):
        print("decoding", flush=True)
        while True:
            check()
            time.sleep(0.01)

loaded = Translator.load(sys.argv[1])
app = build_app({"gru": Endless(loaded.model, loaded.tokenizer)}, Limits(max_seconds=600))
sock = serve.listen("127.0.0.1", 0)
print("port", sock.getsockname()[1], flush=True)
serve.run(app, sock, "warning")
"""


def test_sigterm_during_a_long_decode_answers_json_503_and_exits(
    tiny_checkpoint: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """scripts/serve.py's run under SIGTERM: the request being decoded and the one queued behind
    it both get a JSON 503 that says "shutting down" with a request id, and the process is gone
    within serve.STOP_BOUND seconds."""
    root = ROOT  # the child imports tests.e2e
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tiny_checkpoint)], cwd=root, stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        port = int(child.stdout.readline().split()[1])
        base = f"http://127.0.0.1:{port}"
        with ThreadPoolExecutor(2) as pool:
            running = pool.submit(exchange, base, "/api/translate", {"sentences": ["Ein Hund"]})
            assert child.stdout.readline().strip() == "decoding"
            queued = pool.submit(exchange, base, "/api/translate", {"sentences": ["Ein Mann"]})
            wait_until(lambda: call(base, "/api/models")[1]["models"][0]["queued"] == 1)
            child.send_signal(signal.SIGTERM)
            child.wait(serve.STOP_BOUND)  # raises TimeoutExpired past the bound
            for answered in (running, queued):
                status, headers, raw = answered.result(10)
                answer = json.loads(raw)  # JSON, never a plain-text 500
                assert status == 503 and list(answer) == ["error"], raw
                assert answer["error"].startswith("the server is shutting down")
                assert f"(request id {headers['x-request-id']})" in answer["error"]
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)


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
