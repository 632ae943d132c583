"""The translation server: a page that shows attention, and a JSON API, over loaded Translators.

`build_app({"additive": translator, ...}, Limits())` is a FastAPI app (scripts/serve.py runs it
with uvicorn) that answers

- `GET /`: the attention explorer (seq2seq/serving/page.html, one file with no outside assets);
- `GET /api/models`: each model's name, kind, decoder, scorer, readings and the sentences waiting
  for it;
- `POST /api/translate` `{"sentences": [...], "beam": 5, "nbest": 1, "alignments": true,
  "models": [...]}`: per model, one `Translation.to_dict()` per sentence;
- `POST /api/align` `{"sentences": [...], "references": [...]}`: per model, `Translator.align`'s
  teacher-forced reading of each reference, as `Translation.to_dict()`.

Both POSTs take `"reading": "foresight"` for models with a foresight head (`seq2seq fit-foresight`;
`readings` in /api/models lists it): the matrices and links are then the head's, whose query has read
the word it aligns, and each result's `reading` says so; the translation is the same.

Answers are `{"results": {model: [...]}, "warnings": [...]}`, or `{"error": "..."}` with a 4xx
status for a request the server will not run (seq2seq.serving.requests; one over the work budget,
seq2seq.serving.budget, is refused before it is queued) and 503 when a model's queue is full
(seq2seq.serving.batcher). A POST must say `Content-Type: application/json` (415 otherwise), and
no answer carries CORS headers unless `allow_origins` names the page's origin. An error of the
server's own is logged with its traceback under a request id, and answered with 500 and that id
only. Each model has its own queue: a request for three models is three jobs, answered when the
last is done; while one model's batch runs, the others' jobs wait in their queues, so a batch's
`--max-seconds` count from when it starts to run (seq2seq.serving.batcher). A client that
disconnects while its request waits takes its jobs out of the queues.
The answer is written (seq2seq.serving.answers) in a worker thread, not on the event loop.

Every torch call of the server (loading the checkpoints, every batch of every model) runs on one
thread, the `TorchThread`; the event loop's thread never runs one. Torch on a CPU keeps an OpenMP
pool of threads for each thread that runs its ops, and two pools on two cores get in each other's
way (docs/results/benchmarks.md: with a second thread that had translated still alive, greedy calls of one
sentence gave 28.7 sentences/s instead of 48.0, of sixteen 130.2 instead of 198.4).
"""

import asyncio
import logging
import queue
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Hashable, Sequence
from concurrent.futures import Future
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
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
from seq2seq.serving.answers import encode_answer, release_memory, run_batch
from seq2seq.serving.batcher import Batcher, Busy, Check, Stopped, Turns
from seq2seq.serving.budget import MB, MS, Cost, align_costs, check_cost, translate_costs
from seq2seq.serving.hosts import HostCheck, known_names
from seq2seq.serving.requests import (
    Limits,
    RequestError,
    align_request,
    parse_json,
    require_json,
    translate_request,
)

CLIENT_GONE = 499  # nginx's status for "the client closed the connection"; nobody reads it
STOP_SECONDS = 3.0  # how long shutdown waits for the models' workers and the torch thread
TRIM_BYTES = 1 << 20  # answers larger than this give the allocator's freed memory back after them
log = logging.getLogger(__name__)


class TorchThread:
    """The one thread that runs the server's torch calls (the module docstring says why). Calls
    from any thread wait for their turn; one call runs at a time, so the models of a server take
    turns (on a CPU they share the same cores anyway; their batchers share its `turns`, so a batch
    leaves its queue only when it can run at once), and `warnings.catch_warnings`, which swaps
    process-wide state and is not thread-safe before Python 3.14, is only used from here. The
    thread is a daemon: a process that stops does not wait for a call with no check in it (a long
    source being encoded on a busy machine) beyond `close`'s timeout."""

    def __init__(self) -> None:
        self._calls: queue.SimpleQueue = queue.SimpleQueue()  # (future, fn, args), None: stop
        self.turns = Turns()  # the batchers whose batches run here take it before taking one
        self._thread = threading.Thread(target=self._serve, name="torch", daemon=True)
        self._thread.start()

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)` on the torch thread, after the calls before it; its result or its error."""
        future: Future = Future()
        self._calls.put((future, fn, args))
        return future.result()

    def close(self, timeout: float | None = None) -> None:
        """Stop after the calls already made; wait for that at most `timeout` seconds."""
        self._calls.put(None)
        self._thread.join(timeout)

    def _serve(self) -> None:
        while (call := self._calls.get()) is not None:
            future, fn, args = call
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args))
                except BaseException as err:  # the caller gets it; the thread goes on
                    future.set_exception(err)


@dataclass
class ServedModel:
    """A loaded model and the queue in front of it."""

    name: str
    translator: Translator
    batcher: Batcher

    @property
    def readings(self) -> list[str]:
        """The readings the model offers: its attention, and its foresight head's if it has one."""
        return ["attention"] + ([] if self.translator.foresight is None else ["foresight"])

    def describe(self) -> dict[str, Any]:
        args = getattr(self.translator.model, "model_args", {})
        return {
            "name": self.name,
            "model": args.get("model"),  # rnn or transformer
            "decoder": args.get("decoder", "bahdanau") if args.get("model") == "rnn" else None,
            "score": args.get("score"),  # the GRU's scorer: additive, dot or scaled
            "readings": self.readings,  # what alignments can be read from
            "max_len": self.translator.model.max_len,
            "queued": self.batcher.queued,
        }


def build_app(
    translators: dict[str, Translator],
    limits: Limits,
    torch_thread: TorchThread | None = None,
    allow_origins: Sequence[str] = (),
    hosts: frozenset[str] = known_names("127.0.0.1"),
) -> FastAPI:
    """The server's app over `translators` (name -> Translator), each run on `torch_thread` (the
    thread that loaded them, say; a new one when None), which the app closes when it stops. Pages
    from `allow_origins` (`https://example.org`) may call the API from a browser (CORS); requests
    whose Host is not one of `hosts` get 400 (seq2seq.serving.hosts). `app.state.stop()` refuses
    what is queued and ends the running batches (what scripts/serve.py calls on SIGTERM)."""
    runner = torch_thread or TorchThread()
    budget = Cost(limits.max_work * MS, limits.max_memory * MB)

    def run(translator: Translator, key: Hashable, items: list[Any], check: Check) -> list[Any]:
        return runner.call(run_batch, translator, key, items, check)

    served = {
        name: ServedModel(name, translator, Batcher(
            partial(run, translator), limits.max_batch, limits.max_queue, name=f"serve-{name}",
            max_cost=budget, max_queue_work=limits.max_queue_work * MS,
            max_seconds=limits.max_seconds, turns=runner.turns,
        ))
        for name, translator in translators.items()
    }  # fmt: skip
    names = list(served)
    foresight = {name for name, model in served.items() if "foresight" in model.readings}
    page = files("seq2seq.serving").joinpath("page.html").read_text("utf-8")

    def stop() -> None:
        for model in served.values():
            model.batcher.stop()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        stop()  # refuse what is queued; the running batch ends at its next check
        deadline = time.monotonic() + STOP_SECONDS  # for all of them together
        for model in served.values():
            await asyncio.to_thread(model.batcher.close, max(0, deadline - time.monotonic()))
        await asyncio.to_thread(runner.close, max(0, deadline - time.monotonic()))

    app = FastAPI(title="seq2seq", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.stop = stop
    app.add_middleware(AnswerInternalErrors)
    app.add_middleware(HostCheck, names=hosts)  # outside the others: a foreign Host gets nothing
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
        asked = translate_request(await read_json(request, limits), limits, names, foresight)
        attended = asked.search.nbest if asked.attention == "all" else 1
        chosen = [served[name].translator for name in asked.models]
        costs = await run_in_threadpool(
            translate_costs, chosen, asked.sentences, asked.search, attended, asked.reading
        )  # sentencepiece, a few ms for a long request: off the loop
        check_cost(costs, limits)
        key = ("translate", asked.search, asked.alignments, asked.attention, asked.reading)
        return await answer(request, asked.models, key, asked.sentences, costs, asked.warnings)

    @app.post("/api/align")
    async def align(request: Request) -> Response:
        asked = align_request(await read_json(request, limits), limits, names, foresight)
        chosen = [served[name].translator for name in asked.models]
        costs = await run_in_threadpool(
            align_costs, chosen, asked.sentences, asked.references, asked.reading
        )
        check_cost(costs, limits)
        pairs = list(zip(asked.sentences, asked.references, strict=True))
        key = ("align", asked.reading)
        return await answer(request, asked.models, key, pairs, costs, asked.warnings)

    async def answer(
        request: Request, chosen: list[str], key: Hashable, items: list[Any], costs: list[Cost],
        notes: list[str],
    ) -> Response:  # fmt: skip
        """Queue `items` for each chosen model and answer with all their results."""
        jobs: list[tuple[Batcher, Future]] = []
        try:
            for name, cost in zip(chosen, costs, strict=True):
                batcher = served[name].batcher
                jobs.append((batcher, batcher.submit(key, items, cost)))
        except (Busy, Stopped) as err:
            for batcher, future in jobs:  # all models or none
                batcher.abandon(future)
            if isinstance(err, Busy):
                return error(503, f"busy: {err}; try again shortly", {"Retry-After": "1"})
            return stopped(request, err)
        try:
            outputs = await wait_unless_gone(request, jobs)
        except Stopped as err:
            return stopped(request, err)
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
    """The answer's JSON from each chosen model's (result, warnings) per item; in a worker thread.
    After a large answer, the memory it took goes back to the system."""
    warned = list(notes)
    for name, output in zip(chosen, outputs, strict=True):
        for i, (_, details) in enumerate(output):
            warned += [f"{name}: sentences[{i}]: {detail}" for detail in details]
    results = {name: [d for d, _ in out] for name, out in zip(chosen, outputs, strict=True)}
    body = encode_answer(results, warned)
    del results, outputs[:]
    if len(body) > TRIM_BYTES:
        release_memory()
    return body


def stopped(request: Request, err: Exception) -> JSONResponse:
    """503 for a request that was refused or ended unrun (`Stopped`), with a request id."""
    request_id = uuid.uuid4().hex[:12]
    log.warning("request %s: %s %s: %s", request_id, request.method, request.url.path, err)
    message = f"{err} (request id {request_id})"
    return error(503, message, {"X-Request-ID": request_id, "Retry-After": "1"})


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
        except asyncio.CancelledError:  # the server stopped waiting for it (its shutdown timed out)
            if started:
                raise
            request_id = uuid.uuid4().hex[:12]
            log.warning("request %s: %s %s: cancelled", request_id, scope["method"], scope["path"])
            message = (
                f"the server is shutting down: the request was not finished (request id "
                f"{request_id})"
            )
            answer = error(503, message, {"X-Request-ID": request_id})
            await answer(scope, receive, send)  # not Starlette's plain-text 500
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


async def wait_unless_gone(
    request: Request, jobs: list[tuple[Batcher, Future]]
) -> list[Any] | None:
    """The jobs' results (the first error raised), or None if the client disconnects first: then
    each job is abandoned (a queued one leaves its queue; a batch whose clients have all gone
    ends at its next check). No asyncio future is left holding an error nobody reads."""
    waiting = [asyncio.wrap_future(future) for _, future in jobs]
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        pending: set[asyncio.Future] = set(waiting)
        while pending and not gone.done():
            done, pending = await asyncio.wait(
                pending | {gone}, return_when=asyncio.FIRST_COMPLETED
            )
            pending.discard(gone)
            if any(_failed(f) for f in done if f is not gone):
                break  # the first error is the answer
    finally:
        gone.cancel()
    failed = [w.exception() for w in waiting if _failed(w)]
    if not failed and all(w.done() and not w.cancelled() for w in waiting):
        return [w.result() for w in waiting]
    for wrapped in waiting:  # no effect on a done one; a pending one stops waiting
        wrapped.cancel()
    for batcher, future in jobs:
        batcher.abandon(future)
    if failed:
        raise failed[0]
    return None


def _failed(future: asyncio.Future) -> bool:
    """Done with an error (which this reads, so nothing logs it as never retrieved)."""
    return future.done() and not future.cancelled() and future.exception() is not None


async def _disconnected(request: Request) -> None:
    """Returns when the client has gone (the body has been read: only a disconnect comes now)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
