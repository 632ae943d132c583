"""What the server sends back: each batch's results as plain values, and the answer's JSON bytes.

`run_batch` runs on the torch thread (seq2seq.serving.server): it calls the model and turns each
Translation into lists (`Translation.to_dict()`, matrices not yet rounded), keeping the attention
matrices (`attention`, `word_attention`) of the best hypothesis only, unless the request asked for
those of every n-best hypothesis (`"attention": "all"`); the other hypotheses keep their text,
score, subwords and word links. `encode_answer` then rounds the matrices to DIGITS decimals and
writes the JSON, in a worker thread, never on the event loop's: a large answer takes a while to
write, and the loop meanwhile answers everyone else. It writes a matrix row by row: json.dumps in
C holds the GIL until it returns, so one call on the whole answer would stall the loop as surely
as running it there, while a row is a few hundred numbers. After each row the writer hands the GIL
to whichever thread waits for it (`time.sleep(0)`): left to the interpreter's switch interval, every
one of the many GIL hand-offs of a small request's decoding would wait up to 5 ms behind the writer.
"""

import json
import time
import warnings
from collections.abc import Hashable, Iterator
from dataclasses import replace
from functools import partial
from typing import Any

from seq2seq.decoding.translator import Translation, Translator, TruncatedInput
from seq2seq.serving.requests import Attention

DIGITS = 4  # attention weights in answers: 4 decimals, as translate.py's JSON lines
MATRICES = ("attention", "word_attention")  # (rows, columns) of weights, rounded to DIGITS
# As Starlette's JSONResponse writes: compact, UTF-8 as is, no NaN or Infinity (not JSON)
dumps = partial(json.dumps, ensure_ascii=False, allow_nan=False, separators=(",", ":"))

Output = tuple[dict[str, Any], list[str]]  # one item's result, and the warnings about it


def run_batch(translator: Translator, key: Hashable, items: list[Any]) -> list[Output]:
    """One batch of a model, on the torch thread: `key` is ("translate", SearchConfig, alignments,
    attention) with sentences as `items`, or ("align",) with (sentence, reference) pairs. Per
    item: its result (`result_dict`) and the details of the TruncatedInput warnings Translator
    gave for it."""
    attention: Attention = "best"
    with warnings.catch_warnings(record=True) as caught:  # on the torch thread only
        warnings.simplefilter("always", TruncatedInput)
        if key[0] == "align":
            sources, references = zip(*items, strict=True)
            results = translator.align(list(sources), list(references))
        else:
            _, search, alignments, attention = key
            results = translator.translate(items, search, return_alignments=alignments)
    notes: list[list[str]] = [[] for _ in items]
    for warning in caught:  # ours name the sentence in this batch; others pass through unchanged
        if isinstance(warning.message, TruncatedInput):
            notes[warning.message.index].append(warning.message.detail)
        else:
            warnings.showwarning(
                warning.message, warning.category, warning.filename, warning.lineno
            )
    dicts = [result_dict(result, attention) for result in results]
    return list(zip(dicts, notes, strict=True))


def result_dict(result: Translation, attention: Attention) -> dict[str, Any]:
    """`result.to_dict()` (matrices unrounded), its n-best hypotheses with their matrices only
    when `attention` is "all" (the best one's are the result's own)."""
    out = replace(result, nbest=[]).to_dict()
    if result.nbest:
        out["nbest"] = [hypothesis_dict(hyp, attention == "all") for hyp in result.nbest]
    return out


def hypothesis_dict(hyp: Translation, matrices: bool) -> dict[str, Any]:
    """`hyp.to_dict()`, without its attention matrices unless `matrices`; they are left out
    before they become lists, so what is not sent costs nothing."""
    if matrices:
        return hyp.to_dict()
    word_attention = None if hyp.word_attention is None else hyp.word_attention[:0]  # (0, S_w)
    out = replace(hyp, attention=hyp.attention[:0], word_attention=word_attention).to_dict()
    for name in MATRICES:
        out.pop(name, None)
    return out


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


def _rows(matrix: list[list[float]]) -> Iterator[str]:
    """A matrix's rows as JSON, rounded to DIGITS, the GIL handed on after each."""
    for row in matrix:
        yield dumps([round(v, DIGITS) for v in row])
        time.sleep(
            0
        )  # releases the GIL: a waiting thread takes it now, not a switch interval later


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
