"""What the server's JSON API accepts: the limits, and request bodies checked field by field.

Every mistake in a request is one `RequestError` with its HTTP status and a one-line message that
names the field, so a program (or a person with curl) can fix it without reading the server's log:
400 for a body that is not UTF-8 JSON, 413 for one over the limits, 415 for a body not sent as
`application/json`, 422 for a field of the wrong type or value. The message quotes at most a short
piece of what was sent, never Python's own text about it. A sentence longer than `max_chars` is
not refused but cut, with a warning in the answer, as `Translator` cuts a source longer than a
Transformer reads.
"""

import email.message
import json
import math
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor

from seq2seq.alignment.words import READINGS, Reading
from seq2seq.decoding.search_config import SearchConfig
from seq2seq.errors import UserError


def _limit(default: int, help: str) -> Any:
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class Limits:
    """What one server takes on (scripts/serve.py has a flag per field). A bad value is a
    UserError naming the setting."""

    max_batch: int = _limit(32, "sentences in one request, and in one batch of the model")
    max_queue: int = _limit(256, "sentences waiting per model; a request past it gets 503 busy")
    max_chars: int = _limit(1000, "characters read of a sentence or reference; the rest is cut")
    max_beam: int = _limit(
        16,
        "the largest beam (and n-best) a request may ask for; a request that names no beam gets "
        f"the search's default, {SearchConfig.beam}, or this if it is smaller",
    )
    max_work: int = _limit(
        3000,
        "work one request may cost, in milliseconds of one thread of the CPU the estimate was "
        "fitted on, summed over its sentences and models (docs/guides/serving.md); also the most one "
        "batch of the model holds",
    )
    max_memory: int = _limit(
        300, "MB one request (and one batch) may hold at once: kept weights, caches, the answer"
    )
    max_output: int = _limit(200, "the longest output in subwords (EOS included) the server writes")
    max_seconds: float = _limit(
        10.0,
        "seconds one batch may run, counted from when it starts, and one request wait for it "
        "(in the queue, and while other models' batches run on the one torch thread); past them "
        "the batch is stopped (or the request left unrun) and its requests get 503",
    )
    max_queue_work: int = _limit(
        6000, "work waiting per model (ms, as --max-work); a request past it gets 503 busy"
    )

    def __post_init__(self) -> None:
        # a queue holding less work than one request still takes one when it is empty
        for name in (
            "max_batch",
            "max_chars",
            "max_beam",
            "max_work",
            "max_memory",
            "max_queue_work",
        ):
            if getattr(self, name) < 1:
                raise UserError(f"`{name}` must be at least 1, got {getattr(self, name)}")
        if self.max_output < 2:
            raise UserError(
                f"`max_output` must be at least 2 (a subword and EOS), got {self.max_output}"
            )
        if not self.max_seconds > 0:
            raise UserError(f"`max_seconds` must be positive, got {self.max_seconds}")
        if self.max_queue < self.max_batch:
            raise UserError(
                f"`max_queue` must be at least `max_batch` ({self.max_batch}), so that every "
                f"request fits an empty queue; got {self.max_queue}"
            )

    @property
    def max_body(self) -> int:
        """Bytes of a request body: room for `max_batch` pairs of `max_chars`-character sentences
        even as JSON's 12-byte escapes of a character outside the BMP, and 64 KiB for the rest."""
        return 64 * 1024 + 2 * self.max_batch * 12 * self.max_chars


# A number in a body has at most this many digits: the fields take small whole numbers, and Python
# refuses to read one of over 4,300 digits (with a message about sys.set_int_max_str_digits).
MAX_DIGITS = 100

# Which hypotheses of a search carry their attention matrices in the answer.
Attention = Literal["best", "all"]


@dataclass(frozen=True)
class ServedSearch(SearchConfig):
    """A search whose outputs the server caps at `max_output` subwords, EOS included (None: the
    search's own limits only). The searches read every length limit from `limits`, so a
    sentence at the cap ends there with EOS, as one at its ratio limit does."""

    max_output: int | None = None

    def limits(self, src_lens: Tensor) -> Tensor:
        """SearchConfig's limits, none past `max_output`. (B,) -> (B,)."""
        limits = super().limits(src_lens)  # (B,)
        return limits if self.max_output is None else limits.clamp(max=self.max_output)

    def capped(self, source: int) -> bool:
        """Whether the cap is below the search's own limit for a source of `source` subwords."""
        own = int(super().limits(torch.tensor([source]))[0])
        return self.max_output is not None and self.max_output < own


class RequestError(Exception):
    """A request the server will not run: `status` is the HTTP status of the answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class TranslateRequest:
    """POST /api/translate: `sentences` (cut to `max_chars`), searched with `search` by `models`."""

    sentences: list[str]
    search: ServedSearch
    alignments: bool
    attention: Attention  # "best": only the best hypothesis's matrices; "all": every n-best one's
    models: list[str]
    warnings: list[str]  # one per sentence that was cut
    reading: Reading = "attention"  # what the matrices and links are read from


@dataclass(frozen=True)
class AlignRequest:
    """POST /api/align: each of `models` reads `references[i]` as its translation of `sentences[i]`."""

    sentences: list[str]
    references: list[str]
    models: list[str]
    warnings: list[str]
    reading: Reading = "attention"


def require_json(content_type: str | None) -> None:
    """415 unless the Content-Type header says application/json (a charset may follow). A browser
    sends a text/plain POST to another site without asking first (no CORS preflight); refusing
    every other type means a page elsewhere cannot make a visitor's browser run a request here."""
    header = email.message.Message()
    header["content-type"] = content_type or ""
    if not content_type or header.get_content_type() != "application/json":
        got = content_type.split(";")[0].strip()[:60] if content_type else "none"
        raise RequestError(415, f"send the body as Content-Type: application/json (got {got})")


def parse_json(body: bytes) -> dict[str, Any]:
    """The JSON object in `body`: 400 for bytes that are not UTF-8 or not JSON (nested too deeply
    to read included), 422 for JSON that is not an object or holds a number out of range."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as err:
        byte = body[err.start]
        raise RequestError(
            400, f"the body is not UTF-8 (byte {err.start} is {byte:#04x})"
        ) from None
    try:
        value = json.loads(
            text, parse_int=_read_int, parse_float=_read_float, parse_constant=_not_json
        )
    except json.JSONDecodeError as err:
        raise RequestError(
            400, f"the body is not JSON ({err.msg} at character {err.pos})"
        ) from None
    except RecursionError:
        raise RequestError(400, "the body is nested too deeply to read") from None
    if not isinstance(value, dict):
        raise RequestError(422, f"the body must be a JSON object, got {_kind(value)}")
    return value


def _read_int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_DIGITS:
        raise RequestError(
            422, f"the body holds a number of {len(digits.lstrip('-'))} digits; no field takes "
            f"one of over {MAX_DIGITS}"
        )  # fmt: skip
    return int(digits)


def _read_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999 reads as inf: no field takes it
        raise RequestError(422, f"the body holds a number out of range ({text[:20]})")
    return value


def _not_json(name: str) -> None:
    """Python reads NaN and Infinity, which JSON does not have."""
    raise RequestError(400, f"the body is not JSON ({name} is not a JSON value)")


def translate_request(
    body: dict[str, Any], limits: Limits, names: list[str], foresight: Collection[str] = ()
) -> TranslateRequest:
    """Check a /api/translate body; `names` are the models this server has, `foresight` those of
    them with a foresight head."""
    known = {"sentences", "beam", "nbest", "alignments", "attention", "models", "reading"}
    _known_fields(body, known)
    sentences, notes = _sentences(body, "sentences", limits)
    # Defaults from SearchConfig, the one home of the search defaults, within what this server
    # allows: a client that names no beam is not refused for one it never sent.
    beam = _integer(body, "beam", min(SearchConfig.beam, limits.max_beam), limits.max_beam)
    nbest = _integer(body, "nbest", min(SearchConfig.nbest, beam), limits.max_beam)
    if nbest > beam:
        raise RequestError(422, f"nbest ({nbest}) must not exceed beam ({beam})")
    alignments = body.get("alignments", True)
    if not isinstance(alignments, bool):
        raise RequestError(422, f"alignments must be true or false, got {_shown(alignments)}")
    attention = body.get("attention", "best")
    if attention not in ("best", "all"):
        raise RequestError(422, f'attention must be "best" or "all", got {_shown(attention)}')
    search = ServedSearch(beam=beam, nbest=nbest, max_output=limits.max_output)
    models = _models(body, names)
    reading = _reading(body, models, foresight)
    if reading != "attention" and not alignments:
        raise RequestError(
            422, f'reading "{reading}" reads the alignments: send "alignments": true'
        )
    return TranslateRequest(sentences, search, alignments, attention, models, notes, reading)


def align_request(
    body: dict[str, Any], limits: Limits, names: list[str], foresight: Collection[str] = ()
) -> AlignRequest:
    """Check a /api/align body; `names` are the models this server has, `foresight` those of them
    with a foresight head."""
    _known_fields(body, {"sentences", "references", "models", "reading"})
    sentences, notes = _sentences(body, "sentences", limits)
    references, ref_notes = _sentences(body, "references", limits)
    if len(references) != len(sentences):
        raise RequestError(
            422, f"{len(sentences)} sentences but {len(references)} references: give one each"
        )
    models = _models(body, names)
    reading = _reading(body, models, foresight)
    return AlignRequest(sentences, references, models, notes + ref_notes, reading)


def _reading(body: dict[str, Any], models: list[str], foresight: Collection[str]) -> Reading:
    """The `reading` field (default "attention"): "foresight" only when every chosen model holds a
    foresight head."""
    reading = body.get("reading", "attention")
    if reading not in READINGS:
        named = " or ".join(f'"{name}"' for name in READINGS)
        raise RequestError(422, f"reading must be {named}, got {_shown(reading)}")
    lacking = [name for name in models if name not in foresight]
    if reading == "foresight" and lacking:
        raise RequestError(
            422, f'reading "foresight": model {lacking[0]!r} holds no foresight head (one is '
            "fitted with `seq2seq fit-foresight CKPT --out CKPT2`)"
        )  # fmt: skip
    return reading


def _known_fields(body: dict[str, Any], known: set[str]) -> None:
    """A misspelt field would otherwise be ignored without a word: 422."""
    unknown = sorted(set(body) - known)
    if unknown:
        takes = ", ".join(sorted(known))
        raise RequestError(422, f"unknown field {_cut(unknown[0])!r} (this request takes {takes})")


def _sentences(body: dict[str, Any], name: str, limits: Limits) -> tuple[list[str], list[str]]:
    """`body[name]`: 1 to `max_batch` non-blank strings, each cut to `max_chars` characters; and a
    warning per cut one."""
    if name not in body:
        raise RequestError(422, f"{name} is missing: give a list of sentences")
    value = body[name]
    if not isinstance(value, list):
        raise RequestError(422, f"{name} must be a list of strings, got {_kind(value)}")
    for i, text in enumerate(value):
        if not isinstance(text, str):
            raise RequestError(422, f"{name}[{i}] must be a string, got {_kind(text)}")
        if not text.isascii() and not _is_text(text):
            raise RequestError(
                422, f"{name}[{i}] holds a lone surrogate (\\ud800-\\udfff): not text"
            )
    if not value:
        raise RequestError(422, f"{name} is empty: give at least one sentence")
    if len(value) > limits.max_batch:
        raise RequestError(
            413, f"{len(value)} {name} in one request; this server takes at most {limits.max_batch}"
        )
    warnings = []
    for i, text in enumerate(value):
        if not text.strip():
            raise RequestError(422, f"{name}[{i}] is blank: give a sentence")
        if len(text) > limits.max_chars:
            warnings.append(
                f"{name}[{i}]: {len(text)} characters and the server reads {limits.max_chars}: cut"
            )
    return [text[: limits.max_chars] for text in value], warnings


def _is_text(text: str) -> bool:
    """False for a string with a lone surrogate, which JSON's \\ud800 escapes can make and no
    tokenizer can read (it is not UTF-8)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _integer(body: dict[str, Any], name: str, default: int, most: int) -> int:
    value = body.get(name, default)
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= most:
        raise RequestError(
            422, f"{name} must be a whole number from 1 to {most}, got {_shown(value)}"
        )
    return value


def _models(body: dict[str, Any], names: list[str]) -> list[str]:
    """The models a request names (default: all), in the server's order; 422 for an unknown one."""
    asked = body.get("models", names)
    if not isinstance(asked, list) or not asked or not all(isinstance(x, str) for x in asked):
        raise RequestError(422, f"models must be a non-empty list of names, got {_kind(asked)}")
    for name in asked:
        if name not in names:
            raise RequestError(
                422, f"unknown model {_cut(name)!r} (this server has {', '.join(names)})"
            )
    return [name for name in names if name in asked]


def _shown(value: Any) -> str:
    """`value` for a message: a number, true/false, null or a string (cut to 40 characters) as JSON
    writes it; how JSON names the type of anything else."""
    if isinstance(value, list | dict):
        return _kind(value)
    return _cut(json.dumps(value, ensure_ascii=False))


def _cut(text: str) -> str:
    return text if len(text) <= 40 else text[:37] + "..."


def _kind(value: Any) -> str:
    """How JSON would name the type of `value`, for messages."""
    kinds = {dict: "an object", list: "a list", str: "a string", bool: "true/false"}
    kinds |= {int: "a number", float: "a number", type(None): "null"}
    return kinds.get(type(value), type(value).__name__)
