"""A server process given SIGTERM during a long decode: the request being decoded and the one queued
behind it get a JSON 503, and the process is gone within serve.STOP_BOUND seconds."""

import json
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.unit.serving.test_serve import call, exchange, serve, wait_until

CHILD = """
import sys, threading, time
from seq2seq.decoding.translator import Translator
from seq2seq.serving.requests import Limits
from seq2seq.serving.server import build_app
from tests.unit.serving.test_serve import serve

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
    root = ROOT  # the child imports tests.unit
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
