"""What the server sends back: each batch's results as plain values, and the answer's JSON bytes.

`run_batch` runs on the torch thread (seq2seq.serving.server): it calls the model and turns each
Translation into plain values (`Translation.to_dict()`), except its attention matrices
(`attention`, `word_attention`), which stay (T, S) float32 tensors: as Python lists of floats
they took eight times the memory (a float object and a pointer a number) and, once freed, left
that memory with the allocator. It keeps the matrices of the best hypothesis only, unless the
request asked for those of every n-best hypothesis (`"attention": "all"`); the other hypotheses
keep their text, score, subwords and word links. `encode_answer` then writes the JSON, in a
worker thread, never on the event loop's: a large answer takes a while to write, and the loop
meanwhile answers everyone else. It writes a matrix row by row, each rounded to DIGITS decimals
as a tensor (float32 * 10^4 is exact in float64, so this is Python's `round`), then listed and
dumped: json.dumps in C holds the GIL until it returns, so one call on the whole answer would
stall the loop as surely as running it there, while a row is a few hundred numbers. After each
row the writer hands the GIL to whichever thread waits for it (`time.sleep(0)`): left to the
interpreter's switch interval, every one of the many GIL hand-offs of a small request's decoding
would wait up to 5 ms behind the writer. After an answer of over a megabyte, the server calls
`release_memory`, which hands the allocator's freed pages back to the system (glibc keeps them).
"""

import ctypes
import json
import time
import warnings
from collections.abc import Hashable, Iterator
from dataclasses import replace
from functools import partial
from typing import Any

from torch import Tensor

from seq2seq.decoding.translator import Translation, Translator, TruncatedInput
from seq2seq.serving.batcher import Check
from seq2seq.serving.requests import Attention, ServedSearch

DIGITS = 4  # attention weights in answers: 4 decimals, as translate.py's JSON lines
MATRICES = ("attention", "word_attention")  # (rows, columns) of weights, rounded to DIGITS
# As Starlette's JSONResponse writes: compact, UTF-8 as is, no NaN or Infinity (not JSON)
dumps = partial(json.dumps, ensure_ascii=False, allow_nan=False, separators=(",", ":"))

Output = tuple[dict[str, Any], list[str]]  # one item's result, and the warnings about it


def run_batch(
    translator: Translator, key: Hashable, items: list[Any], check: Check | None = None
) -> list[Output]:
    """One batch of a model, on the torch thread: `key` is ("translate", ServedSearch, alignments,
    attention, reading) with sentences as `items`, or ("align", reading) with (sentence, reference)
    pairs, `reading` what the matrices and links are read from (Translator's); `check`
    is called between the model's steps (it raises to end the batch). Per item: its result
    (`result_dict`) and the details of the TruncatedInput warnings Translator gave for it, and a
    note for an output cut at the server's `max_output`."""
    attention: Attention = "best"
    with warnings.catch_warnings(record=True) as caught:  # on the torch thread only
        warnings.simplefilter("always", TruncatedInput)
        if key[0] == "align":
            sources, references = zip(*items, strict=True)
            results = translator.align(list(sources), list(references), check=check, reading=key[1])
        else:
            _, search, alignments, attention, reading = key
            results = translator.translate(
                items, search, return_alignments=alignments, check=check, reading=reading
            )
    notes: list[list[str]] = [[] for _ in items]
    if key[0] == "translate":
        for note, result in zip(notes, results, strict=True):
            note += _cut_output(search, result)
    for warning in caught:  # ours name the sentence in this batch; others pass through unchanged
        if isinstance(warning.message, TruncatedInput):
            notes[warning.message.index].append(warning.message.detail)
        else:
            warnings.showwarning(
                warning.message, warning.category, warning.filename, warning.lineno
            )
    dicts = [result_dict(result, attention) for result in results]
    return list(zip(dicts, notes, strict=True))


def _cut_output(search: ServedSearch, result: Translation) -> list[str]:
    """A note when the output reached the server's cap, below the search's own limit."""
    S, T = len(result.src_tokens), len(result.tgt_tokens)
    if not isinstance(search, ServedSearch) or search.max_output is None:
        return []
    if T < search.max_output or not search.capped(S):
        return []
    return [f"the output was cut at {search.max_output} subwords (--max-output)"]


def result_dict(result: Translation, attention: Attention) -> dict[str, Any]:
    """`result.to_dict()`, its matrices as (T, S) float32 tensors (module docstring), its n-best
    hypotheses with their matrices only when `attention` is "all" (the best one's are the
    result's own)."""
    out = hypothesis_dict(replace(result, nbest=[]), True)
    if result.nbest:
        out["nbest"] = [hypothesis_dict(hyp, attention == "all") for hyp in result.nbest]
    return out


def hypothesis_dict(hyp: Translation, matrices: bool) -> dict[str, Any]:
    """`hyp.to_dict()` with its matrices as tensors when `matrices`, else without them; they are
    left out before they become lists, so what is not sent costs nothing."""
    word_attention = None if hyp.word_attention is None else hyp.word_attention[:0]  # (0, S_w)
    out = replace(hyp, attention=hyp.attention[:0], word_attention=word_attention).to_dict()
    for name in MATRICES:
        if name in out and matrices:
            out[name] = _matrix(hyp, name)
        elif name in out:
            del out[name]
    return out


def _matrix(hyp: Translation, name: str) -> Tensor:
    """(T, S) float32: `attention` with its heads reduced as `to_dict` reduces them, or
    `word_attention`."""
    if name == "word_attention":
        return hyp.word_attention.float()  # (T_w, S_w)
    weights = hyp.attention  # (T, S) or (T, N, S)
    if weights.dim() == 3:
        head = hyp.alignment_head
        weights = weights.mean(1) if head is None else weights[:, head]  # (T, S)
    return weights.float()


def encode_answer(results: dict[str, list[dict[str, Any]]], warned: list[str]) -> bytes:
    """`{"results": results, "warnings": warned}` as JSON, matrices rounded to DIGITS decimals:
    what json.dumps would write, in pieces (the module docstring says why)."""
    parts = ['{"results":{']
    for k, (name, answers) in enumerate(results.items()):
        parts += ["," if k else "", dumps(name), ":["]
        for i, answer in enumerate(answers):
            parts += ["," if i else "", *_hypothesis(answer)]
        parts.append("]")
    parts += ['},"warnings":', dumps(warned), "}"]
    return "".join(parts).encode("utf-8")


def _rows(matrix: Tensor | list[list[float]]) -> Iterator[str]:
    """A matrix's rows as JSON, rounded to DIGITS, the GIL handed on after each."""
    if isinstance(matrix, Tensor):  # (T, S) float32
        rows: Any = matrix.double().round(decimals=DIGITS)  # (T, S)
    else:  # nested lists, as Translation.to_dict gives
        rows = ([round(v, DIGITS) for v in row] for row in matrix)
    for row in rows:
        yield dumps(row.tolist() if isinstance(row, Tensor) else row)
        # releases the GIL: a waiting thread takes it now, not a switch interval later
        time.sleep(0)


def _hypothesis(answer: dict[str, Any]) -> Iterator[str]:
    yield "{"
    for k, (key, value) in enumerate(answer.items()):
        yield ("," if k else "") + dumps(key) + ":"
        if key in MATRICES:
            yield "[" + ",".join(_rows(value)) + "]"
        elif key == "nbest":
            yield "[" + ",".join("".join(_hypothesis(hyp)) for hyp in value) + "]"
        else:
            yield dumps(value)
    yield "}"


def release_memory() -> None:
    """Hand the pages the C allocator keeps after large frees back to the system (glibc's
    malloc_trim; nothing elsewhere)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass
