"""The server's defences: the work budget, attention only where asked, answers written off the event
loop, JSON-only POSTs and CORS, one-line answers to bad bodies, and 500s that tell only an id.

Servers run on 127.0.0.1 on ports the OS picks (tests/e2e/test_serve.py's live_server);
every wait has a deadline.
"""

import json
import logging
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch

from seq2seq.decoding.translator import Translation, Translator
from seq2seq.serving import server as server_module
from seq2seq.serving.answers import encode_answer
from seq2seq.serving.budget import MS, Cost, align_costs, output_limit, subwords, translate_costs
from seq2seq.serving.requests import Limits, ServedSearch
from tests.e2e.test_serve import (
    SENTENCES,
    as_json,
    call,
    exchange,
    live_server,
    serve,
    served_app,
    transformer_checkpoint,  # noqa: F401 (a fixture, used by name)
)

LONG = " ".join(SENTENCES * 40)[:1000]  # a sentence at the default --max-chars


class CountingTranslator(Translator):
    """A Translator that counts its translate calls: a refused request must leave it at 0."""

    def __init__(self, loaded: Translator) -> None:
        super().__init__(loaded.model, loaded.tokenizer)
        self.calls = self.aligned = 0

    def translate(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return super().translate(*args, **kwargs)

    def align(self, *args: Any, **kwargs: Any) -> Any:
        self.aligned += 1
        return super().align(*args, **kwargs)


@pytest.fixture(scope="module")
def loaded(tiny_checkpoint: Path) -> Translator:
    return Translator.load(tiny_checkpoint)


def test_request_over_the_work_budget_is_refused_before_decoding(loaded: Translator) -> None:
    """32 sentences of 1,000 characters at beam 16 and n-best 16: within every per-field limit
    (the defaults), over the default budget; refused with one line that names --max-work."""
    model = CountingTranslator(loaded)
    body = {"sentences": [LONG] * 32, "beam": 16, "nbest": 16}
    with live_server({"gru": model}, Limits()) as base:
        status, answer = call(base, "/api/translate", body)
        assert status == 413 and model.calls == 0  # the model was never called
        assert "--max-work" in answer["error"] and "3,000 ms" in answer["error"]
        assert "\n" not in answer["error"]
        body = {"sentences": [LONG[:200]] * 32, "references": [LONG[:200]] * 32}
        assert call(base, "/api/align", body)[0] == 200  # teacher-forced reading: far less work
        assert call(base, "/api/translate", {"sentences": SENTENCES[:2]})[0] == 200
    assert model.calls == 1


def test_request_just_under_the_budget_is_answered(
    loaded: Translator,
    transformer_checkpoint: Path,  # noqa: F811
) -> None:
    """The estimate is the budget: at it, answered (and the outputs stay within the estimate's
    lengths); one cell over, refused unrun."""
    models = {"gru": CountingTranslator(loaded)}
    models["transformer"] = CountingTranslator(Translator.load(transformer_checkpoint))
    sentences = [SENTENCES[0], LONG[:150]]
    body = {"sentences": sentences, "beam": 3, "nbest": 2}
    search = ServedSearch(beam=3, nbest=2, max_output=Limits().max_output)
    work = sum(translate_costs(list(models.values()), sentences, search, 1), Cost()).work
    most = -(-work // MS)  # the budget in whole ms that just takes it
    with live_server(models, Limits(max_work=most - 1)) as base:
        status, answer = call(base, "/api/translate", body)
        assert status == 413 and f"{work / MS:,.0f} ms" in answer["error"]
        assert [m.calls for m in models.values()] == [0, 0]
    with live_server(models, Limits(max_work=most)) as base:
        status, answer = call(base, "/api/translate", body)
    assert status == 200 and [m.calls for m in models.values()] == [1, 1]
    for name, model in models.items():  # what the model read and wrote fits the estimate
        for S, result in zip(subwords(model, sentences), answer["results"][name], strict=True):
            assert len(result["src_tokens"]) == S
            assert len(result["tgt_tokens"]) <= output_limit(model, search, S)


@pytest.fixture(scope="module")
def gru_server(loaded: Translator) -> Any:
    with live_server({"gru": loaded}, Limits(max_batch=4, max_chars=200)) as base:
        yield base


def test_only_the_best_hypothesis_carries_attention_unless_all_are_asked_for(
    gru_server: str, loaded: Translator
) -> None:
    direct = loaded.translate(SENTENCES[:2], return_alignments=True, beam=3, nbest=3)
    body = {"sentences": SENTENCES[:2], "beam": 3, "nbest": 3}
    status, answer = call(gru_server, "/api/translate", body)
    assert status == 200
    for got, want in zip(answer["results"]["gru"], direct, strict=True):
        full = as_json(want.to_dict(4))
        assert got["attention"] == full["attention"]  # the best hypothesis's own
        assert got["word_attention"] == full["word_attention"]
        assert len(got["nbest"]) == 3
        for hyp, whole in zip(got["nbest"], full["nbest"], strict=True):
            assert "attention" not in hyp and "word_attention" not in hyp
            assert hyp == {k: v for k, v in whole.items() if "attention" not in k}
    status, answer = call(gru_server, "/api/translate", {**body, "attention": "all"})
    assert status == 200
    assert answer["results"]["gru"] == as_json([r.to_dict(4) for r in direct])


def test_attention_of_all_hypotheses_counts_against_the_budget(loaded: Translator) -> None:
    # long enough that the three more matrices of each sentence cost more than a whole ms
    sentences, search = [LONG[:300]] * 2, ServedSearch(beam=4, nbest=4, max_output=200)
    [best] = translate_costs([loaded], sentences, search, attended=1)
    [every] = translate_costs([loaded], sentences, search, attended=4)
    assert every.work > best.work and every.memory > best.memory
    body = {"sentences": sentences, "beam": 4, "nbest": 4}
    most = -(-best.work // MS)
    assert every.work > most * MS, "make the sentences longer: the two fit one budget"
    with live_server({"gru": loaded}, Limits(max_work=most)) as base:
        assert call(base, "/api/translate", body)[0] == 200
        status, answer = call(base, "/api/translate", {**body, "attention": "all"})
    assert status == 413 and "--max-work" in answer["error"]


class LargeAnswers(Translator):
    """A Translator whose every sentence comes back at once with 16 hypotheses of 200 x 150
    weights: an answer of millions of numbers to write, without the wait of decoding them."""

    def translate(self, sentences: list[str], *args: Any, **kwargs: Any) -> list[Translation]:
        T, S = 200, 150
        src, tgt = ["▁a"] * (S - 1) + ["</s>"], ["▁b"] * (T - 1) + ["</s>"]
        hyps = [Translation("b " * k, -1.0 * k, src, tgt, torch.rand(T, S)) for k in range(16)]
        return [Translation("b", -1.0, src, tgt, torch.rand(T, S), nbest=hyps) for _ in sentences]


def test_a_large_answer_being_written_stalls_no_other_client(
    loaded: Translator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a large answer is being written (its writer held by a gate, which would stall every
    client if it were written on the event loop), a small request gets its answer: a state the
    test waits for, not a time it measures."""
    writing, gate = threading.Event(), threading.Event()

    def encode(results: dict[str, Any], warned: list[str]) -> bytes:
        if "large" in results:
            writing.set()
            assert gate.wait(20), "the test never opened the gate"
        return encode_answer(results, warned)

    monkeypatch.setattr(server_module, "encode_answer", encode)
    models = {"large": LargeAnswers(loaded.model, loaded.tokenizer), "gru": loaded}
    large = {"sentences": SENTENCES[:3], "beam": 16, "nbest": 16, "attention": "all",
             "models": ["large"]}  # fmt: skip
    small = {"sentences": SENTENCES[:1], "beam": 1, "models": ["gru"]}
    limits = Limits(max_work=10**6, max_memory=10**6)
    with live_server(models, limits) as base, ThreadPoolExecutor(1) as pool:
        try:
            big = pool.submit(call, base, "/api/translate", large)
            assert writing.wait(60)
            status, _ = call(base, "/api/translate", small)
            beside = not gate.is_set()  # answered while the large answer was still being written
        finally:
            gate.set()
        status_big, answer = big.result(60)
    assert status == 200 and beside
    assert status_big == 200 and len(answer["results"]["large"][2]["nbest"][15]["attention"]) == 200


def test_answer_json_is_written_in_pieces_as_json_dumps_would(loaded: Translator) -> None:
    [result] = loaded.translate(SENTENCES[:1], return_alignments=True, beam=3, nbest=2)
    whole = result.to_dict()  # unrounded, as run_batch hands them on
    body = encode_answer({"gru": [whole], "ü": [whole]}, ["a warning"])
    rounded = as_json(result.to_dict(4))
    assert json.loads(body) == {"results": {"gru": [rounded], "ü": [rounded]},
                                "warnings": ["a warning"]}  # fmt: skip
    assert "ü".encode() in body  # UTF-8 as is, as Starlette's JSONResponse writes


def test_post_must_say_json_and_no_cors_headers_by_default(gru_server: str) -> None:
    good = json.dumps({"sentences": ["Ein Hund"]}).encode()
    for kind in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data"):
        status, answer = call(gru_server, "/api/translate", raw=good, Content_Type=kind)
        assert status == 415 and answer["error"] == (
            f"send the body as Content-Type: application/json (got {kind})"
        )
        assert call(gru_server, "/api/align", raw=good, Content_Type=kind)[0] == 415
    typed = "application/json; charset=utf-8"
    assert call(gru_server, "/api/translate", raw=good, Content_Type=typed)[0] == 200
    origin = {"Origin": "https://elsewhere.example"}
    status, headers, _ = exchange(gru_server, "/api/translate", raw=good, **origin)
    assert status == 200 and not any(name.startswith("access-control") for name in headers)
    preflight = {"Access_Control_Request_Method": "POST", **origin}
    _, headers, _ = exchange(gru_server, "/api/translate", method="OPTIONS", **preflight)
    assert not any(name.startswith("access-control") for name in headers)


def test_allow_origin_flag_lets_that_origin_alone_call_from_a_browser(
    tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[tuple[Any, socket.socket]] = []
    monkeypatch.setattr(serve, "run", lambda app, sock, level: started.append((app, sock)))
    allowed = "https://allowed.example"
    argv = [str(tiny_checkpoint), "--port", "0", "--allow-origin", allowed]
    assert serve.main(argv) == 0
    [(app, sock)] = started
    good = json.dumps({"sentences": ["Ein Hund"]}).encode()
    ask = {
        "Access_Control_Request_Method": "POST",
        "Access_Control_Request_Headers": "content-type",
    }
    with served_app(app, sock) as base:
        status, headers, _ = exchange(base, "/api/translate", raw=good, Origin=allowed)
        assert status == 200 and headers["access-control-allow-origin"] == allowed
        status, headers, _ = exchange(base, "/api/translate", method="OPTIONS", Origin=allowed,
                                      **ask)  # fmt: skip
        assert status == 200 and headers["access-control-allow-origin"] == allowed
        assert "POST" in headers["access-control-allow-methods"]
        other = "https://elsewhere.example"
        _, headers, _ = exchange(base, "/api/translate", raw=good, Origin=other)
        assert "access-control-allow-origin" not in headers
        _, headers, _ = exchange(base, "/api/translate", method="OPTIONS", Origin=other, **ask)
        assert "access-control-allow-origin" not in headers


NESTED = b"[" * 20_000 + b"]" * 20_000  # past the recursion limit, within the body limit
BAD_BODIES = {
    "a 5,000-digit beam": (b'{"sentences": ["x"], "beam": 1' + b"0" * 4999 + b"}", 422),
    "a huge float beam": (b'{"sentences": ["x"], "beam": 1e999}', 422),
    "a huge float sentence": (b'{"sentences": [-1e400]}', 422),
    "a float beam": (b'{"sentences": ["x"], "beam": 5.0}', 422),
    "NaN": (b'{"sentences": ["x"], "beam": NaN}', 400),
    "a nested body": (NESTED, 400),
    "a nested beam": (b'{"sentences": ["x"], "beam": ' + NESTED + b"}", 400),
    "a nested sentence": (b'{"sentences": [' + NESTED + b"]}", 400),
    "beam true": (b'{"sentences": ["x"], "beam": true}', 422),
    "beam a list": (b'{"sentences": ["x"], "beam": [5]}', 422),
    "alignments a string": (b'{"sentences": ["x"], "alignments": "yes"}', 422),
    "attention unknown": (b'{"sentences": ["x"], "attention": "some"}', 422),
    "models a string": (b'{"sentences": ["x"], "models": "gru"}', 422),
    "sentences an object": (b'{"sentences": {"a": "x"}}', 422),
    "sentences missing": (b"{}", 422),
    "a lone surrogate": (b'{"sentences": ["Ein \\ud800 Hund"]}', 422),
    "a long unknown field": (b'{"' + b"x" * 10_000 + b'": 1, "sentences": ["x"]}', 422),
    "a list body": (b'["Ein Hund"]', 422),
    "a string body": (b'"Ein Hund"', 422),
    "a number body": (b"3", 422),
    "a null body": (b"null", 422),
    "an empty body": (b"", 400),
}
INTERNAL = ("Error", "Exception", "Traceback", "File ", "sys.", "digits)", "0000000000")


@pytest.mark.parametrize("case", BAD_BODIES.values(), ids=BAD_BODIES)
def test_every_bad_body_gets_a_one_line_4xx_without_internals(
    gru_server: str, case: tuple[bytes, int]
) -> None:
    raw, expected = case
    status, answer = call(gru_server, "/api/translate", raw=raw)
    assert status == expected and list(answer) == ["error"], answer
    message = answer["error"]
    assert "\n" not in message and len(message) < 200, message
    assert not any(word in message for word in INTERNAL), message
    status, answer = call(gru_server, "/api/align", raw=raw)  # read by the same code
    assert 400 <= status < 500 and not any(word in answer["error"] for word in INTERNAL)
    status, answer = call(gru_server, "/api/align", raw=b'{"sentences": ["x"]}')
    assert status == 422 and answer["error"] == "references is missing: give a list of sentences"
    assert call(gru_server, "/api/translate", {"sentences": ["Ein Hund"]})[0] == 200


def test_server_error_is_logged_with_an_id_and_answered_with_the_id_only(
    loaded: Translator, caplog: pytest.LogCaptureFixture
) -> None:
    class Broken(Translator):
        def translate(self, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("secret detail: /srv/models/x.ckpt")

    models = {"broken": Broken(loaded.model, loaded.tokenizer), "gru": loaded}
    with caplog.at_level(logging.ERROR), live_server(models, Limits()) as base:
        status, headers, raw = exchange(base, "/api/translate", {"sentences": ["Ein Hund"]})
        answer = json.loads(raw)
        assert call(base, "/api/translate", {"sentences": ["x"], "models": ["gru"]})[0] == 200
    request_id = headers["x-request-id"]
    assert status == 500 and answer == {
        "error": f"internal error; the server's log has it under request id {request_id}"
    }
    [record] = [r for r in caplog.records if request_id in r.getMessage()]
    assert record.exc_info and "secret detail" in str(record.exc_info[1])
    assert "POST /api/translate" in record.getMessage()


def test_align_over_the_budget_is_refused_too(loaded: Translator) -> None:
    sentences, references = [LONG[:200]] * 4, [LONG[:200]] * 4
    body = {"sentences": sentences, "references": references}
    [cost] = align_costs([loaded], sentences, references)
    most = cost.work // MS  # whole ms, just under the estimate
    assert most >= 1, "make the pairs longer: they cost under 1 ms"
    model = CountingTranslator(loaded)
    with live_server({"gru": model}, Limits(max_work=most)) as base:
        status, answer = call(base, "/api/align", body)
        assert status == 413 and "--max-work" in answer["error"] and model.aligned == 0
    with live_server({"gru": model}, Limits(max_work=most + 1)) as base:
        assert call(base, "/api/align", body)[0] == 200
    assert model.aligned == 1
