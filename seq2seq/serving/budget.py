"""The work budget of a request: what it would cost, estimated before any of it is decoded.

Per-field limits alone let a request through that is small in every field and huge in all of
them together: 32 sentences of 1,000 characters at beam 16 and n-best 16 is within each limit,
and would keep the model busy for minutes and build an answer of hundreds of megabytes. So the
server estimates a request's work in **attention cells** (one weight: one source subword seen
from one output step of one hypothesis) and refuses one over `Limits.max_work` with 413 before
it is queued. Per sentence and model, with S its source subwords (EOS included, cut as the model
cuts it) and T the longest output the search allows (SearchConfig.limits: 1.5 x S + 10, no more
than a Transformer's positions):

    translate:  S x T x (beam + hypotheses whose attention is sent back: 1, or n-best with "all")
    align:      S x T x 2, T the reference's subwords + EOS (one reading, one matrix sent back)

The first term is the search (each of `beam` hypotheses attends over S at each of T steps and
keeps those weights), the second the answer (each matrix sent back is T x S numbers, as Python
floats and then as JSON). It is an upper bound: outputs usually end before T.
"""

from collections.abc import Sequence

import torch

from seq2seq.decoding.search_config import SearchConfig, output_limits
from seq2seq.decoding.translator import Translator
from seq2seq.serving.requests import Limits, RequestError


def subwords(translator: Translator, texts: list[str]) -> list[int]:
    """Subwords per text as `translator` reads it: EOS included, cut to a Transformer's positions."""
    lengths = [len(ids) for ids in translator.tokenizer.encode_batch(texts, threads=1)]
    most = translator.model.max_len  # None for the GRU: no limit
    return [(n if most is None else min(n, most - 1)) + 1 for n in lengths]


def output_limit(translator: Translator, search: SearchConfig, source: int) -> int:
    """The longest output (EOS included) a search may give for `source` subwords: the searches'
    own `output_limits`, for one sentence."""
    return int(output_limits(translator.model, search, torch.tensor([source]))[0])


def translate_work(
    translators: Sequence[Translator], sentences: list[str], search: SearchConfig, attended: int
) -> int:
    """Attention cells of translating `sentences` with each of `translators` (module docstring);
    `attended`: hypotheses per sentence whose attention is sent back."""
    total = 0
    for translator in translators:
        for S in subwords(translator, sentences):
            total += S * output_limit(translator, search, S) * (search.beam + attended)
    return total


def align_work(
    translators: Sequence[Translator], sentences: list[str], references: list[str]
) -> int:
    """Attention cells of each of `translators` reading `references` teacher-forced."""
    total = 0
    for translator in translators:
        sources, targets = subwords(translator, sentences), subwords(translator, references)
        total += sum(S * T * 2 for S, T in zip(sources, targets, strict=True))
    return total


def check_work(work: int, limits: Limits) -> None:
    """413 for a request estimated at more than `limits.max_work` attention cells."""
    if work > limits.max_work:
        raise RequestError(
            413,
            f"this request would cost up to {work:,} attention cells and the server takes "
            f"{limits.max_work:,} a request (--max-work): send fewer or shorter sentences, "
            "a smaller beam or n-best, or fewer models",
        )
