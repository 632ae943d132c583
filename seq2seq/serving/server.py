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
status for a request the server will not run (seq2seq.serving.requests) and 503 when a model's queue
is full (seq2seq.serving.batcher). Each model has its own queue: a request for three models is three
jobs, answered when the last is done. A client that disconnects while its request waits takes its
jobs out of the queues.

Every torch call of the server (loading the checkpoints, every batch of every model) runs on one
thread, the `TorchThread`; the event loop's thread never runs one. Torch on a CPU keeps an OpenMP
pool of threads for each thread that runs its ops, and two pools on two cores get in each other's
way (docs/benchmarks.md: with a second thread that had translated still alive, greedy calls of one
sentence gave 28.7 sentences/s instead of 48.0, of sixteen 130.2 instead of 198.4).
"""

import asyncio
import warnings
from collections.abc import AsyncIterator, Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from importlib.resources import files
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from seq2seq.decoding.translator import Translator, TruncatedInput
from seq2seq.serving.batcher import Batcher, Busy
from seq2seq.serving.requests import (
    Limits,
    RequestError,
    align_request,
    parse_json,
    translate_request,
)

DIGITS = 4  # attention weights in answers: 4 decimals, as translate.py's JSON lines
CLIENT_GONE = 499  # nginx's status for "the client closed the connection"; nobody reads it


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


def run_batch(
    translator: Translator, key: Hashable, items: list[Any]
) -> list[tuple[dict[str, Any], list[str]]]:
    """One batch of a model: `key` is ("translate", SearchConfig, alignments) with sentences as
    `items`, or ("align",) with (sentence, reference) pairs. Per item: its `to_dict()` and the
    details of the TruncatedInput warnings Translator gave for it."""
    with warnings.catch_warnings(record=True) as caught:  # on the torch thread only
        warnings.simplefilter("always", TruncatedInput)
        if key[0] == "align":
            sources, references = zip(*items, strict=True)
            results = translator.align(list(sources), list(references))
        else:
            _, search, alignments = key
            results = translator.translate(items, search, return_alignments=alignments)
    notes: list[list[str]] = [[] for _ in items]
    for warning in caught:  # ours name the sentence in this batch; others pass through unchanged
        if isinstance(warning.message, TruncatedInput):
            notes[warning.message.index].append(warning.message.detail)
        else:
            warnings.showwarning(
                warning.message, warning.category, warning.filename, warning.lineno
            )
    return [(result.to_dict(DIGITS), note) for result, note in zip(results, notes, strict=True)]


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
    translators: dict[str, Translator], limits: Limits, torch_thread: TorchThread | None = None
) -> FastAPI:
    """The server's app over `translators` (name -> Translator), each run on `torch_thread` (the
    thread that loaded them, say; a new one when None), which the app closes when it stops."""
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

    @app.get("/", response_class=HTMLResponse)
    async def index() -> HTMLResponse:
        return HTMLResponse(page)

    @app.get("/api/models")
    async def models() -> dict[str, Any]:
        return {"models": [model.describe() for model in served.values()], "limits": vars(limits)}

    @app.post("/api/translate")
    async def translate(request: Request) -> Response:
        asked = translate_request(parse_json(await read_body(request, limits)), limits, names)
        key = ("translate", asked.search, asked.alignments)
        return await answer(request, asked.models, key, asked.sentences, asked.warnings)

    @app.post("/api/align")
    async def align(request: Request) -> Response:
        asked = align_request(parse_json(await read_body(request, limits)), limits, names)
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
        warned = list(notes)
        for name, output in zip(chosen, outputs, strict=True):
            for i, (_, details) in enumerate(output):
                warned += [f"{name}: sentences[{i}]: {detail}" for detail in details]
        results = {name: [d for d, _ in out] for name, out in zip(chosen, outputs, strict=True)}
        return JSONResponse({"results": results, "warnings": warned})

    @app.exception_handler(RequestError)
    async def refused(request: Request, err: RequestError) -> Response:
        return error(err.status, str(err))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, err: HTTPException) -> Response:
        return error(err.status_code, f"{err.detail}: {request.method} {request.url.path}")

    @app.exception_handler(ClientDisconnect)
    async def gone(request: Request, err: ClientDisconnect) -> Response:
        return Response(status_code=CLIENT_GONE)  # left while sending its body: nothing to say

    @app.exception_handler(Exception)
    async def failed(request: Request, err: Exception) -> Response:
        return error(500, f"internal error ({type(err).__name__}: {err})")

    return app


def error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """The answer to a request the server did not run: `{"error": message}`."""
    return JSONResponse({"error": message}, status_code=status, headers=headers)


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
