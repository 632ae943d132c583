"""The translation server: a page that shows attention, and a JSON API, over loaded Translators.

`build_app({"additive": translator, ...}, Limits())` is a FastAPI app (scripts/serve.py runs it
with uvicorn) that answers

- `GET /`: the attention explorer (seq2seq/serving/page.html, one file with no outside assets);
- `GET /api/models`: each model's name, kind, scorer and the sentences waiting for it;
- `POST /api/translate` `{"sentences": [...], "beam": 5, "nbest": 1, "alignments": true,
  "models": [...]}`: per model, one `Translation.to_dict()` per sentence;
- `POST /api/align` `{"sentences": [...], "references": [...]}`: per model, `Translator.align`'s
  teacher-forced reading of each reference, as `Translation.to_dict()`.

Answers are `{"results": {model: [...]}, "warnings": [...]}`, or `{"error": "..."}` with a 4xx
status for a request the server will not run (seq2seq.serving.requests; one over the work budget,
seq2seq.serving.budget, is refused before it is queued) and 503 when a model's queue is full
(seq2seq.serving.batcher). A POST must say `Content-Type: application/json` (415 otherwise), and
no answer carries CORS headers unless `allow_origins` names the page's origin. An error of the
server's own is logged with its traceback under a request id, and answered with 500 and that id
only. Each model has its own queue: a request for three models is three jobs, answered when the
last is done. A client that disconnects while its request waits takes its jobs out of the queues.
The answer is written (seq2seq.serving.answers) in a worker thread, not on the event loop.

Every torch call of the server (loading the checkpoints, every batch of every model) runs on one
thread, the `TorchThread`; the event loop's thread never runs one. Torch on a CPU keeps an OpenMP
pool of threads for each thread that runs its ops, and two pools on two cores get in each other's
way (docs/results/benchmarks.md: with a second thread that had translated still alive, greedy calls of one
sentence gave 28.7 sentences/s instead of 48.0, of sixteen 130.2 instead of 198.4).
"""

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Hashable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from importlib.resources import files
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from seq2seq.decoding.translator import Translator
from seq2seq.serving.answers import encode_answer, run_batch
from seq2seq.serving.batcher import Batcher, Busy
from seq2seq.serving.budget import align_work, check_work, translate_work
from seq2seq.serving.requests import (
    Limits,
    RequestError,
    align_request,
    parse_json,
    require_json,
    translate_request,
)

CLIENT_GONE = 499  # nginx's status for "the client closed the connection"; nobody reads it
log = logging.getLogger(__name__)


class TorchThread:
    """The one thread that runs the server's torch calls (the module docstring says why). Calls
    from any thread wait for their turn; one call runs at a time, so the models of a server take
    turns (on a CPU they share the same cores anyway), and `warnings.catch_warnings`, which swaps
    process-wide state and is not thread-safe before Python 3.14, is only used from here."""

    def __init__(self) -> None:
        # one worker, kept until close(): the same thread runs every call
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="torch")

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)` on the torch thread, after the calls before it; its result or its error."""
        return self._pool.submit(fn, *args).result()

    def close(self) -> None:
        self._pool.shutdown(wait=True)


@dataclass
class ServedModel:
    """A loaded model and the queue in front of it."""

    name: str
    translator: Translator
    batcher: Batcher

    def describe(self) -> dict[str, Any]:
        args = getattr(self.translator.model, "model_args", {})
        return {
            "name": self.name,
            "model": args.get("model"),  # rnn or transformer
            "score": args.get("score"),  # the GRU's scorer: additive, dot or scaled
            "max_len": self.translator.model.max_len,
            "queued": self.batcher.queued,
        }


def build_app(
    translators: dict[str, Translator],
    limits: Limits,
    torch_thread: TorchThread | None = None,
    allow_origins: Sequence[str] = (),
) -> FastAPI:
    """The server's app over `translators` (name -> Translator), each run on `torch_thread` (the
    thread that loaded them, say; a new one when None), which the app closes when it stops. Pages
    from `allow_origins` (`https://example.org`) may call the API from a browser (CORS)."""
    runner = torch_thread or TorchThread()
    served = {
        name: ServedModel(name, translator, Batcher(
            lambda key, items, t=translator: runner.call(run_batch, t, key, items),
            limits.max_batch, limits.max_queue, name=f"serve-{name}",
        ))
        for name, translator in translators.items()
    }  # fmt: skip
    names = list(served)
    page = files("seq2seq.serving").joinpath("page.html").read_text("utf-8")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        for model in served.values():  # finish what was queued; refuse the rest
            await asyncio.to_thread(model.batcher.close)
        await asyncio.to_thread(runner.close)

    app = FastAPI(title="seq2seq", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.add_middleware(AnswerInternalErrors)
    if allow_origins:  # added last, so outermost: a 500 to an allowed page carries CORS too
        app.add_middleware(
            CORSMiddleware, allow_origins=list(allow_origins), allow_methods=["GET", "POST"],
            allow_headers=["Content-Type"],
        )  # fmt: skip

    @app.get("/", response_class=HTMLResponse)
    async def index() -> HTMLResponse:
        return HTMLResponse(page)

    @app.get("/api/models")
    async def models() -> dict[str, Any]:
        return {"models": [model.describe() for model in served.values()], "limits": vars(limits)}

    @app.post("/api/translate")
    async def translate(request: Request) -> Response:
        asked = translate_request(await read_json(request, limits), limits, names)
        attended = asked.search.nbest if asked.attention == "all" else 1
        chosen = [served[name].translator for name in asked.models]
        work = await run_in_threadpool(
            translate_work, chosen, asked.sentences, asked.search, attended
        )  # sentencepiece, a few ms for a long request: off the loop
        check_work(work, limits)
        key = ("translate", asked.search, asked.alignments, asked.attention)
        return await answer(request, asked.models, key, asked.sentences, asked.warnings)

    @app.post("/api/align")
    async def align(request: Request) -> Response:
        asked = align_request(await read_json(request, limits), limits, names)
        chosen = [served[name].translator for name in asked.models]
        work = await run_in_threadpool(align_work, chosen, asked.sentences, asked.references)
        check_work(work, limits)
        pairs = list(zip(asked.sentences, asked.references, strict=True))
        return await answer(request, asked.models, ("align",), pairs, asked.warnings)

    async def answer(
        request: Request, chosen: list[str], key: Hashable, items: list[Any], notes: list[str]
    ) -> Response:
        """Queue `items` for each chosen model and answer with all their results."""
        futures: list[Future] = []
        try:
            for name in chosen:
                futures.append(served[name].batcher.submit(key, items))
        except Busy as err:
            for future in futures:  # all models or none
                future.cancel()
            return error(503, f"busy: {err}; try again shortly", {"Retry-After": "1"})
        outputs = await wait_unless_gone(request, futures)
        if outputs is None:
            return Response(status_code=CLIENT_GONE)
        body = await run_in_threadpool(render, chosen, outputs, notes)  # not on the event loop
        return Response(body, media_type="application/json")

    @app.exception_handler(RequestError)
    async def refused(request: Request, err: RequestError) -> Response:
        return error(err.status, str(err))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, err: HTTPException) -> Response:
        return error(err.status_code, f"{err.detail}: {request.method} {request.url.path}")

    @app.exception_handler(ClientDisconnect)
    async def gone(request: Request, err: ClientDisconnect) -> Response:
        return Response(status_code=CLIENT_GONE)  # left while sending its body: nothing to say

    return app


def render(chosen: list[str], outputs: list[list[Any]], notes: list[str]) -> bytes:
    """The answer's JSON from each chosen model's (result, warnings) per item; in a worker thread."""
    warned = list(notes)
    for name, output in zip(chosen, outputs, strict=True):
        for i, (_, details) in enumerate(output):
            warned += [f"{name}: sentences[{i}]: {detail}" for detail in details]
    results = {name: [d for d, _ in out] for name, out in zip(chosen, outputs, strict=True)}
    return encode_answer(results, warned)


class AnswerInternalErrors:
    """Middleware: an error of the server's own (not a refused request) is logged with its
    traceback and a request id, and answered with 500 and that id only: a traceback, an exception
    class or its message would tell a client about the server's insides and nothing it can fix.
    (Starlette's handler for Exception answers, then raises the error again for the server to log
    without the id; this one ends it here.)"""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def sending(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except Exception:
            request_id = uuid.uuid4().hex[:12]
            log.exception("request %s: %s %s failed", request_id, scope["method"], scope["path"])
            if started:  # half an answer is out: all that is left is to end the connection
                raise
            message = f"internal error; the server's log has it under request id {request_id}"
            answer = error(500, message, {"X-Request-ID": request_id})
            await answer(scope, receive, send)


def error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """The answer to a request the server did not run: `{"error": message}`."""
    return JSONResponse({"error": message}, status_code=status, headers=headers)


async def read_json(request: Request, limits: Limits) -> dict[str, Any]:
    """The request's JSON object: 415 before reading a body not sent as application/json."""
    require_json(request.headers.get("content-type"))
    return parse_json(await read_body(request, limits))


async def read_body(request: Request, limits: Limits) -> bytes:
    """The request's body, read no further than `limits.max_body` bytes (413 past it)."""
    too_big = RequestError(413, f"the body is over {limits.max_body} bytes")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limits.max_body:
        raise too_big
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limits.max_body:
            raise too_big
    return bytes(body)


async def wait_unless_gone(request: Request, futures: list[Future]) -> list[Any] | None:
    """The futures' results, or None (and the futures cancelled) if the client disconnects first."""
    results = asyncio.gather(*(asyncio.wrap_future(future) for future in futures))
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({results, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if results.done():
        return results.result()
    for future in futures:  # still queued: dropped unrun; being run: its result is thrown away
        future.cancel()
    results.cancel()
    return None


async def _disconnected(request: Request) -> None:
    """Returns when the client has gone (the body has been read: only a disconnect comes now)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
