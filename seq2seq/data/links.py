"""Guided alignment: word links from an aligner as a second training signal for attention.

The user gives one Pharaoh line per training pair (`i-j`: source word i, target word j; words are
the raw sentence's whitespace tokens from 0, as everywhere in seq2seq.alignment.words). The path is

    file --read beside the corpus (`attach_links`)--> word links per pair
         --sentencepiece offsets (`piece_links`, in encoding workers)--> piece links in the cache
         --collate (`dense_reference`)--> (B, T, S) 0/1 reference --`alignment_loss`--> a sum

A target piece is linked to every piece of each source word its word links to; pieces of unlinked
words, the EOS row and the EOS column get nothing. The cache keeps the links as a list<uint16>
column `links` of interleaved (source piece, target piece) indices, beside the ids.

The loss sums over the target rows that have at least one link, with R the row-normalised reference
and A the attention the decoder used to predict that target piece:

    ce:   -sum_j R_tj log A_tj              (cross-entropy against the links, Garg et al. 2019)
    mse:   sum_j (A_tj - R_tj)^2            (squared error over the row, EOS and padding included)

It is a sum, like the translation loss: `TranslationSystem` adds weight * sum to the loss sum and
divides the update's gradient by its real target tokens (seq2seq.training.system), ranks and accumulated
batches included.

Dimension letters (the table in seq2seq.models.interface): B batch, S source length, T target length.
"""

from __future__ import annotations

import gzip
import hashlib
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from seq2seq.data.corpus import Pairs
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.data.words import NOT_A_WORD, Link, check_links_fit, word_spans_in_text
from seq2seq.errors import UserError

PIECE_LIMIT = 2**16  # piece indices are stored as uint16: a longer sentence keeps no links
_LINK = re.compile(r"([0-9]+)-([0-9]+)")


@dataclass
class LinkedPairs(Pairs):
    """A chunk of pairs with the alignment line of each pair and its number in `path`."""

    links: list[str] = field(default_factory=list)
    numbers: list[int] = field(default_factory=list)
    path: str = ""


def parse_links(line: str, where: str) -> list[Link]:
    """The (source word, target word) links of one Pharaoh line ("0-0 1-2 ...", none: empty).

    Raises:
        UserError: a token that is not `i-j`; `where` ("<file> line <n>") starts the message.
    """
    links = []
    for token in line.split():
        match = _LINK.fullmatch(token)
        if match is None:
            raise UserError(f"{where}: bad alignment link {token!r} (expected i-j)")
        links.append((int(match[1]), int(match[2])))
    return links


def piece_links(
    word_links: Sequence[Link], src_word_of_piece: Sequence[int], tgt_word_of_piece: Sequence[int]
) -> list[tuple[int, int]]:
    """Word links to (source piece, target piece) links, sorted, each once.

    Each target piece of word j is linked to every piece of each source word linked to j. Pieces
    with word index -1 (NOT_A_WORD) take part in no link.

    Args:
        word_links: (source word, target word) pairs.
        src_word_of_piece, tgt_word_of_piece: per piece, its word (`word_spans_in_text`).
    """
    pieces_of: tuple[dict[int, list[int]], dict[int, list[int]]] = ({}, {})
    for side, words in zip(pieces_of, (src_word_of_piece, tgt_word_of_piece), strict=True):
        for piece, word in enumerate(words):
            if word != NOT_A_WORD:
                side.setdefault(word, []).append(piece)
    found = set()
    for src_word, tgt_word in word_links:
        for t in pieces_of[1].get(tgt_word, ()):
            found.update((s, t) for s in pieces_of[0].get(src_word, ()))
    return sorted(found)


def encode_with_links(tokenizer: Tokenizer, chunk: LinkedPairs, dtype: type) -> tuple:
    """A job for `seq2seq.data.tokenizer.encode_chunks`: the ids of a chunk as `encode_flat` gives them,
    then links per pair (B,) int64 and all links one after another (2 x sum of links,) uint16.

    Ids and offsets come from one `encode_with_spans` call per sentence, so they always agree.

    Raises:
        UserError: a malformed link or one outside its sentence, naming the file and line.
    """
    ids: tuple[list[list[int]], list[list[int]]] = ([], [])
    counts, flat = [], []
    for src, tgt, line, number in zip(
        chunk.src, chunk.tgt, chunk.links, chunk.numbers, strict=True
    ):
        words = parse_links(line, f"{chunk.path} line {number}")
        check_links_fit([words], [src], [tgt], chunk.path, first=number)
        (src_ids, src_spans), (tgt_ids, tgt_spans) = map(tokenizer.encode_with_spans, (src, tgt))
        ids[0].append(src_ids)
        ids[1].append(tgt_ids)
        links = []
        if max(len(src_ids), len(tgt_ids)) < PIECE_LIMIT:  # longer: never trained on anyway
            src_of = word_spans_in_text(src, src_spans)
            links = piece_links(words, src_of, word_spans_in_text(tgt, tgt_spans))
        counts.append(len(links))
        flat.extend(index for link in links for index in link)
    out = []
    for side in ids:
        lengths = np.fromiter(map(len, side), np.int64, len(side))  # (B,)
        out += [lengths, np.fromiter((i for x in side for i in x), dtype, int(lengths.sum()))]
    return (*out, np.array(counts, np.int64), np.array(flat, np.uint16))


def attach_links(chunks: Iterator[Pairs], path: str, limited: bool) -> Iterator[LinkedPairs]:
    """The chunks of `stream_pairs`, each with the alignment lines of its pairs, read alongside.

    The file has one line per row of the split, blank pairs included (their lines are skipped with
    them), and is read as far as the chunks go: memory holds one chunk's lines. `limited`: the
    split was cut (`limit_train_pairs`), so the file may go on after the last pair.

    Raises:
        UserError: the file ends before the split, or (not `limited`) goes on after it.
    """
    lines, done = _lines(path), 0
    for chunk in chunks:
        rows = len(chunk) + chunk.empty
        got = list(islice(lines, rows))
        if len(got) < rows:
            raise UserError(
                f"{path} line {done + len(got) + 1}: missing; the file ends after "
                f"{done + len(got)} lines, but the training split goes on (one line per pair)"
            )
        kept = chunk.kept if chunk.kept is not None else range(len(chunk))
        yield LinkedPairs(
            chunk.src, chunk.tgt, chunk.empty, chunk.kept,
            links=[got[i] for i in kept], numbers=[done + i + 1 for i in kept], path=path,
        )  # fmt: skip
        done += rows
    if not limited and next(lines, None) is not None:
        raise UserError(
            f"{path} line {done + 1}: one line too many; the training split ends at row {done} "
            "(one line per pair)"
        )


def _lines(path: str) -> Iterator[str]:
    """The lines of a plain or gzip file, one at a time, without line ends."""
    opener = gzip.open if str(path).endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8", errors="replace", newline="\n") as file:
            for line in file:
                yield line.rstrip("\r\n")
    except (OSError, EOFError) as err:
        raise UserError(f"{path}: cannot read ({err})") from None


def links_suffix(path: str | Path | None) -> str:
    """The end of a cached split's folder name: "" without links, else "-links-" and 8 hex digits
    that change with the alignment file's place, size or modification time (as the corpus's do)."""
    if path is None:
        return ""
    try:
        stat = Path(path).stat()
    except OSError as err:
        raise UserError(f"`guided_alignment` {path}: cannot read it ({err.strerror})") from None
    key = f"{Path(path).resolve()}:{stat.st_size}:{stat.st_mtime_ns}"
    return "-links-" + hashlib.sha1(key.encode()).hexdigest()[:8]


def dense_reference(links: Sequence[Sequence[int]], T: int, S: int) -> Tensor:
    """The (B, T, S) 0/1 reference of a batch: [b, t, s] = 1 when target piece t of pair b is
    linked to source piece s. `links`: per pair, interleaved (source, target) piece indices."""
    reference = torch.zeros(len(links), T, S)  # (B, T, S)
    counts = torch.tensor([len(x) // 2 for x in links])  # (B,)
    flat = torch.tensor([i for x in links for i in x], dtype=torch.long).view(-1, 2)  # (K, 2)
    rows = torch.repeat_interleave(torch.arange(len(links)), counts)  # (K,)
    reference[rows, flat[:, 1], flat[:, 0]] = 1.0
    return reference
