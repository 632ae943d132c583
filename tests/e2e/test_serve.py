"""The translation server on the trained tiny checkpoint: its API against Translator, bad input, the
busy queue, the page in Chromium (the batcher and the listening socket: tests/unit/serving/).

Servers run on 127.0.0.1 only, on ports the OS picks. A model that must be busy is held in its
translate call by an event (GatedTranslator), so "busy" and "left the queue" are states the test
waits for, not timing it hopes for. Every wait has a deadline.
"""

import contextlib
import http.client
import json
import shutil
import socket
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
import uvicorn

from seq2seq.commands import serve
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.decoding.translator import Translator
from seq2seq.models.build import build_model
from seq2seq.serving.requests import Limits
from seq2seq.serving.server import TorchThread, build_app
from tests.conftest import make_pairs
from tests.unit.serving.test_serve import wait_until

PAIRS = make_pairs(6, seed=31)
SENTENCES = [de for de, _ in PAIRS]
GOOD = {"sentences": SENTENCES[:2], "beam": 2}
MAX_LEN = 40  # the tiny Transformer's positions: a long source is cut by Translator itself
LIMITS = Limits(max_batch=4, max_queue=8, max_chars=200)


def call(
    base: str, path: str, body: Any = None, raw: bytes | None = None, **headers: str
) -> tuple[int, Any]:
    """GET `path` (no body) or POST `body` as JSON (or the bytes `raw`, as application/json unless
    `headers` give another Content_Type): status and parsed answer."""
    status, _, answer = exchange(base, path, body, raw, **headers)
    return status, json.loads(answer)


def exchange(
    base: str, path: str, body: Any = None, raw: bytes | None = None, method: str = "",
    **headers: str,
) -> tuple[int, dict[str, str], bytes]:  # fmt: skip
    """`call`'s request (or `method`'s); status, headers (names in lower case) and the raw body.
    Header arguments spell `-` as `_` (Content_Type="text/plain")."""
    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    data = raw if raw is not None else None if body is None else json.dumps(body).encode()
    sent = {"Content-Type": "application/json"} if data is not None else {}
    sent |= {name.replace("_", "-"): value for name, value in headers.items()}
    try:
        conn.request(method or ("GET" if data is None else "POST"), path, data, sent)
        answer = conn.getresponse()
        got = {name.lower(): value for name, value in answer.getheaders()}
        return answer.status, got, answer.read()
    finally:
        conn.close()


def queued(base: str) -> int:
    return sum(model["queued"] for model in call(base, "/api/models")[1]["models"])


@contextlib.contextmanager
def live_server(
    translators: dict[str, Translator], limits: Limits, torch_thread: TorchThread | None = None,
    **options: Any,
) -> Iterator[str]:  # fmt: skip
    """build_app(translators, limits, torch_thread, **options) served by uvicorn in a thread on
    127.0.0.1; yields its base URL."""
    app = build_app(translators, limits, torch_thread, **options)
    with served_app(app) as base:
        yield base


@contextlib.contextmanager
def served_app(app: Any, sock: socket.socket | None = None) -> Iterator[str]:
    """`app` served by uvicorn in a thread on `sock` (default: a new one on 127.0.0.1)."""
    # listening from now on: early clients wait in its backlog
    sock = sock or socket.create_server(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(20)
        sock.close()


class GatedTranslator(Translator):
    """A Translator that waits in `translate` until `gate` is set: a worker held busy on purpose."""

    def __init__(self, model: Any, tokenizer: Tokenizer) -> None:
        super().__init__(model, tokenizer)
        self.gate, self.entered, self.calls = threading.Event(), threading.Event(), 0

    def translate(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        self.entered.set()
        assert self.gate.wait(30), "the test never opened the gate"
        return super().translate(*args, **kwargs)


@pytest.fixture(scope="module")
def transformer_checkpoint(tiny_tokenizer: Tokenizer, tmp_path_factory: Any) -> Path:
    """An untrained one-layer Transformer with MAX_LEN positions, saved as a checkpoint."""
    torch.manual_seed(0)
    args = {"model": "transformer", "vocab_size": tiny_tokenizer.vocab_size, "d_model": 16,
            "heads": 2, "layers": 1, "ff_size": 32, "dropout": 0.0, "max_len": MAX_LEN}  # fmt: skip
    weights = {f"model.{k}": v for k, v in build_model(args).state_dict().items()}
    path = tmp_path_factory.mktemp("serve") / "transformer.ckpt"
    tokenizer = tiny_tokenizer.to_bytes()
    torch.save({"model_args": args, "state_dict": weights, "tokenizer": tokenizer}, path)
    return path


@pytest.fixture(scope="module")
def paths(tiny_checkpoint: Path, transformer_checkpoint: Path) -> dict[str, Path]:
    return {"gru": tiny_checkpoint, "transformer": transformer_checkpoint}


@pytest.fixture(scope="module")
def server(paths: dict[str, Path]) -> Iterator[str]:
    """Both models behind LIMITS; the tests compare against their own Translators."""
    with live_server({name: Translator.load(path) for name, path in paths.items()}, LIMITS) as base:
        yield base


@pytest.fixture(scope="module")
def gated(tiny_checkpoint: Path) -> Iterator[tuple[str, GatedTranslator]]:
    """The GRU held by a gate, behind a queue of one sentence."""
    loaded = Translator.load(tiny_checkpoint)
    model = GatedTranslator(loaded.model, loaded.tokenizer)
    model.gate.set()
    with live_server({"gru": model}, Limits(max_batch=1, max_queue=1)) as base:
        yield base, model


def as_json(value: Any) -> Any:
    return json.loads(json.dumps(value))


@pytest.mark.parametrize("settings", [{"beam": 1}, {"beam": 3, "nbest": 2}])
def test_translate_answers_as_translator_does(
    server: str, paths: dict[str, Path], settings: dict[str, int]
) -> None:
    # every hypothesis's attention, as Translator gives (by default only the best one's is sent)
    body = {"sentences": SENTENCES[:4], "attention": "all", **settings}
    status, answer = call(server, "/api/translate", body)
    assert status == 200 and answer["warnings"] == []
    assert list(answer["results"]) == ["gru", "transformer"]
    for name, path in paths.items():
        direct = Translator.load(path).translate(SENTENCES[:4], return_alignments=True, **settings)
        assert answer["results"][name] == as_json([r.to_dict(4) for r in direct])
    assert answer["results"]["gru"][0]["word_alignment"]  # links were asked for and came back


def test_align_answers_as_translator_does(server: str, paths: dict[str, Path]) -> None:
    references = [en for _, en in PAIRS[:3]]
    body = {"sentences": SENTENCES[:3], "references": references, "models": ["gru"]}
    status, answer = call(server, "/api/align", body)
    assert status == 200 and list(answer["results"]) == ["gru"]
    direct = Translator.load(paths["gru"]).align(SENTENCES[:3], references)
    assert answer["results"]["gru"] == as_json([r.to_dict(4) for r in direct])
    assert [r["text"] for r in answer["results"]["gru"]] == references


BAD_INPUT = {
    "blank line": (b'{"sentences": ["Ein Hund", "  "]}', 422, "sentences[1] is blank"),
    "not UTF-8": (b'{"sentences": ["Ein \xff Hund"]}', 400, "not UTF-8 (byte 20 is 0xff)"),
    "not JSON": (b'{"sentences": [', 400, "the body is not JSON"),
    "not an object": (b'["Ein Hund"]', 422, "must be a JSON object, got a list"),
    "sentences a string": (b'{"sentences": "Ein Hund"}', 422, "must be a list of strings"),
    "a number for a sentence": (b'{"sentences": [3]}', 422, "sentences[0] must be a string"),
    "no sentences": (b'{"sentence": ["Ein Hund"]}', 422, "unknown field 'sentence'"),
    "beam a string": (b'{"sentences": ["Ein Hund"], "beam": "5"}', 422, "beam must be"),
    "beam too big": (b'{"sentences": ["Ein Hund"], "beam": 17}', 422, "from 1 to 16"),
    "nbest over beam": (b'{"sentences": ["x"], "beam": 2, "nbest": 3}', 422, "must not exceed"),
    "batch over the limit": (json.dumps({"sentences": ["x"] * 5}).encode(), 413, "at most 4"),
    "unknown model": (b'{"sentences": ["x"], "models": ["dot"]}', 422, "unknown model 'dot'"),
    "body too big": (b" " * (LIMITS.max_body + 1), 413, "the body is over"),
}


@pytest.mark.parametrize("case", BAD_INPUT.values(), ids=BAD_INPUT)
def test_bad_input_gets_its_answer_and_serving_goes_on(
    server: str, case: tuple[bytes, int, str]
) -> None:
    raw, status, message = case
    got, answer = call(server, "/api/translate", raw=raw)
    assert (got, list(answer)) == (status, ["error"]) and message in answer["error"]
    assert call(server, "/api/translate", GOOD)[0] == 200


def test_bad_alignment_requests_and_unknown_paths(server: str) -> None:
    body = {"sentences": ["Ein Hund", "Zwei Hunde"], "references": ["A dog"]}
    status, answer = call(server, "/api/align", body)
    assert status == 422 and answer["error"] == "2 sentences but 1 references: give one each"
    status, answer = call(server, "/api/nothing")
    assert status == 404 and answer["error"] == "Not Found: GET /api/nothing"
    assert (
        call(server, "/api/align", {"sentences": ["Ein Hund"], "references": ["A dog"]})[0] == 200
    )


def test_long_sentence_is_cut_with_warnings(server: str) -> None:
    text = " ".join(SENTENCES * 200)[:10_000]
    status, answer = call(server, "/api/translate", {"sentences": ["Ein Hund", text], "beam": 1})
    assert status == 200
    assert answer["warnings"][0] == "sentences[1]: 10000 characters and the server reads 200: cut"
    [truncated] = answer["warnings"][1:]  # the Transformer reads MAX_LEN - 1 subwords: it cut more
    assert truncated.startswith("transformer: sentences[1]: the source has ")
    assert truncated.endswith(f"subwords and the model reads {MAX_LEN - 1}: cut")
    for results in answer["results"].values():
        assert " ".join(results[1]["src_words"]) == " ".join(text[:200].split())
    assert len(answer["results"]["transformer"][1]["src_tokens"]) == MAX_LEN  # with </s>
    assert call(server, "/api/translate", GOOD)[0] == 200


def test_client_gone_while_sending_its_body(server: str) -> None:
    host, port = server.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(
            b"POST /api/translate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000\r\n\r\n{"
        )
    assert call(server, "/api/translate", GOOD)[0] == 200


def test_full_queue_answers_busy_at_once(gated: tuple[str, GatedTranslator]) -> None:
    base, model = gated
    model.gate.clear()
    model.entered.clear()
    with ThreadPoolExecutor(2) as pool:
        try:
            first = pool.submit(call, base, "/api/translate", {"sentences": ["Ein Hund"]})
            assert model.entered.wait(20)  # the worker holds the first request
            second = pool.submit(call, base, "/api/translate", {"sentences": ["Ein Mann"]})
            wait_until(lambda: queued(base) == 1)  # the second fills the queue of one
            # answered while the gate is shut: the third request did not wait for the model
            status, answer = call(base, "/api/translate", {"sentences": ["Eine Frau"]})
            assert status == 503 and answer["error"] == (
                "busy: 1 of 1 sentences already queued, no room for 1 more; try again shortly"
            )
        finally:
            model.gate.set()
        assert first.result(30)[0] == 200 and second.result(30)[0] == 200
    assert call(base, "/api/translate", {"sentences": ["Ein Kind"]})[0] == 200


def test_client_gone_while_queued_leaves_the_queue(gated: tuple[str, GatedTranslator]) -> None:
    base, model = gated
    model.gate.clear()
    model.entered.clear()
    calls = model.calls
    body = json.dumps({"sentences": ["Ein Mann"]}).encode()
    host, port = base.removeprefix("http://").split(":")
    with ThreadPoolExecutor(1) as pool:
        try:
            first = pool.submit(call, base, "/api/translate", {"sentences": ["Ein Hund"]})
            assert model.entered.wait(20)
            with socket.create_connection((host, int(port)), timeout=10) as sock:
                head = "POST /api/translate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                head += f"Content-Length: {len(body)}"
                sock.sendall(head.encode() + b"\r\n\r\n" + body)
                wait_until(lambda: queued(base) == 1)
            wait_until(lambda: queued(base) == 0)  # gone before its turn: out of the queue
        finally:
            model.gate.set()
        assert first.result(30)[0] == 200
    assert call(base, "/api/translate", {"sentences": ["Ein Kind"]})[0] == 200
    assert model.calls == calls + 2  # the request whose client left was never translated


def test_every_model_runs_on_the_one_torch_thread(tiny_checkpoint: Path) -> None:
    """Two models' batches run on the thread given to build_app, never on the event loop's."""
    ran_on: dict[str, int] = {}

    class Recording(Translator):
        def __init__(self, name: str, loaded: Translator) -> None:
            super().__init__(loaded.model, loaded.tokenizer)
            self.name = name

        def translate(self, *args: Any, **kwargs: Any) -> Any:
            ran_on[self.name] = threading.get_ident()
            return super().translate(*args, **kwargs)

    loaded = Translator.load(tiny_checkpoint)
    models = {name: Recording(name, loaded) for name in ("first", "second")}
    torch_thread = TorchThread()
    torch_ident = torch_thread.call(threading.get_ident)
    with live_server(models, LIMITS, torch_thread) as base:
        status, answer = call(base, "/api/translate", {"sentences": ["Ein Hund"]})
    assert status == 200 and set(answer["results"]) == {"first", "second"}
    assert ran_on == {"first": torch_ident, "second": torch_ident}
    assert torch_ident not in (threading.get_ident(), None)


@pytest.mark.parametrize("bad", ["garbage", "missing"])
def test_bad_checkpoint_stops_the_start_before_listening(
    tiny_checkpoint: Path, tmp_path: Path, bad: str, capsys: Any, monkeypatch: Any
) -> None:
    path = tmp_path / f"{bad}.ckpt"
    if bad == "garbage":
        path.write_bytes(b"not a checkpoint")
    opened = []
    monkeypatch.setattr(serve, "listen", lambda *args: opened.append(args))
    assert serve.main([str(tiny_checkpoint), str(path), "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}: ") and err.count("\n") == 1
    assert opened == []  # the port was never asked for


def test_bad_limits_are_one_line(tiny_checkpoint: Path, capsys: Any) -> None:
    assert serve.main([str(tiny_checkpoint), "--max-batch", "8", "--max-queue", "4"]) == 2
    assert capsys.readouterr().err.startswith("error: --max-queue must be at least --max-batch (8)")


@pytest.mark.parametrize("port", ["70000", "-1"])
def test_a_port_out_of_range_is_refused_before_any_checkpoint_is_read(
    port: str, tmp_path: Path, capsys: Any
) -> None:
    # 70000 was taken as 70000 - 65536: the server said it served at port 4464.
    with pytest.raises(SystemExit) as stop:
        serve.main([str(tmp_path / "never-read.ckpt"), "--port", port])
    assert stop.value.code == 2
    assert f"argument --port: {port}: a port is 0 to 65535" in capsys.readouterr().err


def chromium_page(playwright: Any) -> Any:
    """A page in Debian's headless chromium (no browser download: Playwright drives the system's)."""
    chromium = shutil.which("chromium")
    assert chromium, "the browser test needs Debian's chromium: apt-get install chromium"
    browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.set_default_timeout(20_000)  # every wait for the page has a deadline
    return page


def panels_of(page: Any) -> list[list[Any]]:
    """Per model panel: its name, heatmap cells, word links and translation."""
    return page.eval_on_selector_all(
        ".model",
        """panels => panels.map(panel => [
        panel.dataset.model,
        panel.querySelectorAll('svg.heatmap rect[data-i]').length,
        panel.querySelectorAll('.links line').length,
        panel.querySelector('.translation').textContent])""",
    )


def readout_under_pointer(page: Any, panel: int, i: int, j: int) -> str:
    """The pointer on cell (output i, source j) of panel `panel`'s heatmap: its readout."""
    model = page.locator(".model").nth(panel)
    model.locator(f"svg.heatmap rect[data-i='{i}'][data-j='{j}']").hover()
    return model.locator(".readout").text_content()


# both panels show the reference as their translation: the teacher-forced answer is in
SHOWING = """reference => [...document.querySelectorAll('.model .translation')]
    .every(e => e.textContent === reference)"""


def expected_panels(found: dict[str, Any]) -> list[list[Any]]:
    return [
        [name, len(hyp.src_tokens) * len(hyp.tgt_tokens), len(hyp.word_alignment), hyp.text]
        for name, hyp in found.items()
    ]


def reading(hyp: Any, i: int, j: int) -> str:
    """The readout the page shows for `hyp`'s cell (i, j): the answer's 4 digits."""
    return f"{hyp.tgt_tokens[i]} ← {hyp.src_tokens[j]}: {hyp.to_dict(4)['attention'][i][j]:.4f}"


@pytest.mark.slow
def test_page_translates_typed_text_and_reads_references_in_chromium(
    server: str, paths: dict[str, Path]
) -> None:
    """Typed into the page: a sentence gets each model's translation, heatmap (a cell per pair of
    subwords, the weight under the pointer) and word links; a clicked n-best entry shows its own
    attention; teacher-forced, each model reads the typed reference."""
    from playwright.sync_api import sync_playwright

    translators = {name: Translator.load(path) for name, path in paths.items()}
    source, reference = PAIRS[0]
    with sync_playwright() as playwright:
        page = chromium_page(playwright)
        page.goto(server + "/")
        page.wait_for_function(
            "document.getElementById('about').textContent.startsWith('Models: gru')"
        )
        page.locator("#source").press_sequentially(source)  # key by key, as typed
        page.locator("#go").click()
        page.wait_for_function(
            "[...document.querySelectorAll('.model .translation')].filter(e => e.textContent)"
            ".length === 2"
        )
        translated = panels_of(page)
        pointed = readout_under_pointer(page, 0, 1, 0)

        page.locator("#nbest").fill("3")  # beam 5 (the page's default), n-best 3
        page.locator("#go").click()
        page.wait_for_selector(".model ol.nbest li:nth-child(3)")
        page.locator(".model").nth(0).locator("ol.nbest li").nth(2).click()
        third = readout_under_pointer(page, 0, 0, 0)

        page.locator("#forced").check()
        page.locator("#reference").press_sequentially(reference)
        assert page.locator("#go").text_content() == "Align"
        page.locator("#go").click()
        page.wait_for_function(SHOWING, arg=reference)
        forced = panels_of(page)
        forced_pointed = readout_under_pointer(page, 1, 0, 1)
        address = page.evaluate("location.search")
    found = {
        name: t.translate([source], return_alignments=True, nbest=3)[0]
        for name, t in translators.items()
    }  # the page asks for beam 5, the default
    assert translated == expected_panels(found)  # n-best 3 of beam 5 leads with beam 5's best
    assert translated[0][2] > 0  # the trained GRU links words
    assert pointed == reading(found["gru"], 1, 0)
    assert third == reading(found["gru"].nbest[2], 0, 0)  # the third hypothesis's own attention
    read = {name: t.align([source], [reference])[0] for name, t in translators.items()}
    assert forced == expected_panels(read) and [p[3] for p in forced] == [reference] * 2
    assert forced_pointed == reading(read["transformer"], 0, 1)
    assert "ref=" in address  # the address carries the form: a link to it runs it again


@pytest.mark.slow
def test_page_starts_within_the_servers_max_beam_in_chromium(paths: dict[str, Path]) -> None:
    """Under --max-beam 1 the page's beam and n-best start at 1, not its default 5, so a sentence
    typed and sent as it stands is translated (greedily), not refused."""
    from playwright.sync_api import sync_playwright

    loaded = Translator.load(paths["gru"])
    source = SENTENCES[1]
    with (
        live_server({"gru": loaded}, Limits(max_beam=1)) as base,
        sync_playwright() as playwright,
    ):
        page = chromium_page(playwright)
        page.goto(base + "/")
        page.wait_for_function("document.getElementById('about').textContent.startsWith('Models')")
        boxes = [page.locator(f"#{box}").input_value() for box in ("beam", "nbest")]
        # a 5 over the boxes' max of 1 would not even be sent: the browser blocks the form
        assert boxes == ["1", "1"]
        page.locator("#source").fill(source)
        page.locator("#go").click()
        page.wait_for_function(  # a translation, or the server's refusal
            "document.querySelector('.model .translation')?.textContent"
            " || document.getElementById('status').className === 'error'"
        )
        refusal = page.locator("#status.error").all_text_contents()
        shown = page.locator(".model .translation").all_text_contents()
    assert refusal == [] and shown == [loaded.translate([source], beam=1)[0].text]
