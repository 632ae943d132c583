"""The words of a raw sentence: which word each subword piece lies in, and the link between two words.

A *word* is a whitespace-separated token of the raw sentence, numbered from 0 (the Pharaoh
convention, DESIGN §8). A piece that belongs to no word (EOS) gets NOT_A_WORD. Guided alignment
(seq2seq.data.links) maps an aligner's word links onto pieces with these, and the word alignments of
seq2seq.alignment.words map attention back onto words.
"""

import re
from bisect import bisect_right
from collections.abc import Iterable, Sequence

from seq2seq.errors import UserError

Link = tuple[int, int]  # (source word, target word), both 0-based
NOT_A_WORD = -1
_WORD = re.compile(r"\S+")


def word_spans_in_text(text: str, spans: Sequence[tuple[int, int]]) -> list[int]:
    """The word each piece belongs to, from where it lies in the raw text: `text.split()`, from 0.

    sentencepiece normalises before it splits (NFKC, U+200B read as a space, control characters
    dropped), so counting markers in the pieces can miss or add words; counting on the raw text
    cannot. A piece covering no visible character (a "▁" sentencepiece added, or only whitespace)
    joins the next piece's word, or the previous one at the end. A word no piece
    covers (cut off, or removed by normalisation) keeps its number and gets no piece.

    Args:
        text: the raw sentence the pieces were encoded from (or decoded to).
        spans: per piece, its (start, end) characters in `text` (`Tokenizer.encode_with_spans`).
    """
    # Where each word starts and ends; `\S` is `not str.isspace()` (CPython: one definition).
    bounds = [(m.start(), m.end()) for m in _WORD.finditer(text)]
    starts = [start for start, _ in bounds]
    words, waiting, last = [], [], NOT_A_WORD
    for start, end in spans:
        k = bisect_right(starts, start) - 1  # the last word starting at or before the piece
        if start >= end:  # covers no character
            hit = NOT_A_WORD
        elif k >= 0 and start < bounds[k][1]:  # its first character is inside word k
            hit = k
        elif k + 1 < len(starts) and starts[k + 1] < end:  # else its first visible one
            hit = k + 1
        else:
            hit = NOT_A_WORD
        words.append(hit)
        if hit == NOT_A_WORD:
            waiting.append(len(words) - 1)
            continue
        for j in waiting:
            words[j] = hit
        waiting, last = [], hit
    for j in waiting:
        words[j] = last
    return words


def check_links_fit(
    links: Sequence[Iterable[Link]],
    src: Sequence[str],
    tgt: Sequence[str] | None,
    path: str,
    first: int = 1,
) -> None:
    """Refuses a link to a word its pair lacks: a file made for other sentences, or for words split
    another way, would otherwise be read without a word (and score as if the model were wrong).

    Args:
        links: per pair, its (source word, target word) links.
        src, tgt: the pairs' sentences, line-aligned with `links`; tgt None: targets not known yet,
            only source words are checked.
        path: how the file is named in the message, e.g. "--align-ref gold.align".
        first: the line number of the first pair in the file.

    Raises:
        UserError: "<path> line <n>: link i-j is outside the sentence pair (m source words, ...)".
    """
    targets = tgt if tgt is not None else [None] * len(src)
    for number, (pair, s, t) in enumerate(zip(links, src, targets, strict=True), first):
        m = len(s.split())
        n = len(t.split()) if t is not None else None
        for i, j in sorted(pair):
            if i >= m or (n is not None and j >= n):
                words = f"{m} source words" + (f", {n} target words" if n is not None else "")
                raise UserError(
                    f"{path} line {number}: link {i}-{j} is outside the sentence pair ({words})"
                )
