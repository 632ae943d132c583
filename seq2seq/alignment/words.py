"""Word alignments from attention, Pharaoh files, and the alignment error rate.

A *word* is a whitespace-separated token of the raw sentence, numbered from 0 (the Pharaoh
convention, DESIGN §8). Attention lives on subword pieces, shaped (T, S) or (T, N, S) with
`T` target pieces, `S` source pieces and `N` heads; the last source column and the last target
row are EOS (`</s>`). The path from attention to links is

    pieces --word_spans_in_text--> word per piece --merge_to_words--> (T_words, S_words) --hard_links-->

**EOS policy.** The caller gives special pieces (`</s>`) the index -1 (NOT_A_WORD), and
`merge_to_words` drops every piece with index -1: the EOS column's mass is excluded, not spread
over the words, and the EOS row (the decision to stop) aligns to nothing. Models often park most
of a row's mass on EOS (fairseq #4446 reports > 0.6 in almost every row), so rows of the word
matrix sum to less than 1 unless `renormalize=True`. EOS is dropped *before* the argmax in
`hard_links`, so a target word that attends mostly to EOS still links to its best real word.

Two directions (a statistical aligner's, or the attention of a de->en and an en->de translator) become
one set of links with `symmetrize`: their intersection, their union, or grow-diag-final(-and) (Koehn
et al. 2005; fast_align's `atools -c grow-diag-final-and`). `JOINS` names them.

AER (Och & Ney 2003), with A the hypothesis links, S the sure and P the possible gold links
(S ⊆ P), counted over the whole corpus:
    precision = |A∩P| / |A|,  recall = |A∩S| / |S|,  AER = 1 - (|A∩S| + |A∩P|) / (|A| + |S|).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from seq2seq.data.corpus import read_lines
from seq2seq.data.words import NOT_A_WORD, Link, word_spans_in_text
from seq2seq.errors import UserError

_LINK = re.compile(r"([0-9]+)([-p])([0-9]+)")
# The eight neighbours of a link (source step, target step): sides first, then diagonals.
NEIGHBOURS = ((-1, 0), (0, -1), (1, 0), (0, 1), (-1, -1), (-1, 1), (1, -1), (1, 1))


def _membership(word_of_piece: Sequence[int], like: Tensor) -> Tensor:
    """(W, P) 0/1 matrix: entry [w, p] is 1 when piece p belongs to word w; -1 pieces get none."""
    if any(w < NOT_A_WORD for w in word_of_piece):
        raise ValueError(f"word indices must be >= -1, got {min(word_of_piece)}")
    n_words = max(word_of_piece, default=NOT_A_WORD) + 1
    member = torch.zeros(n_words, len(word_of_piece), dtype=like.dtype, device=like.device)
    for piece, word in enumerate(word_of_piece):
        if word != NOT_A_WORD:
            member[word, piece] = 1
    return member  # (W, P)


def merge_to_words(
    weights: Tensor,
    src_word_of_piece: Sequence[int],
    tgt_word_of_piece: Sequence[int],
    reduce: Literal["sum", "mean"] = "mean",
    renormalize: bool = False,
) -> Tensor:
    """Subword attention to a word-level soft alignment.

    A source word receives the summed attention of its pieces (columns add, so rows stay
    distributions over words); a target word takes the mean (or, with `reduce="sum"`, the sum)
    of its pieces' rows. Pieces with word index -1 (EOS, see the module docstring) are dropped.

    Args:
        weights: attention (T, S) or per head (T, N, S), T target pieces, S source pieces.
        src_word_of_piece: S word indices of the source pieces (`word_spans_in_text`).
        tgt_word_of_piece: T word indices of the target pieces (`word_spans_in_text`).
        reduce: how the rows of one target word's pieces combine, "mean" or "sum".
        renormalize: divide each row by its sum after dropping EOS; all-zero rows stay zero.

    Returns:
        (T_words, S_words), or (T_words, N, S_words) for per-head input.
    """
    if weights.dim() not in (2, 3):
        raise ValueError(f"weights must be (T, S) or (T, N, S), got shape {tuple(weights.shape)}")
    if (len(tgt_word_of_piece), len(src_word_of_piece)) != (weights.shape[0], weights.shape[-1]):
        raise ValueError(
            f"weights {tuple(weights.shape)} do not match {len(tgt_word_of_piece)} target and "
            f"{len(src_word_of_piece)} source word indices"
        )
    if reduce not in ("sum", "mean"):
        raise ValueError(f"reduce must be 'sum' or 'mean', got {reduce!r}")
    src_member = _membership(src_word_of_piece, weights)  # (S_words, S)
    tgt_member = _membership(tgt_word_of_piece, weights)  # (T_words, T)
    if reduce == "mean":
        tgt_member = tgt_member / tgt_member.sum(1, keepdim=True).clamp(min=1)
    # (T_words, S_words), or (T_words, N, S_words) with heads
    words = torch.einsum("wt,t...s,vs->w...v", tgt_member, weights, src_member)
    if renormalize:
        total = words.sum(-1, keepdim=True)
        words = torch.where(total > 0, words / total.clamp(min=torch.finfo(words.dtype).tiny), 0)
    return words


def hard_links(
    word_matrix: Tensor, direction: Literal["tgt2src", "src2tgt", "intersect"] = "tgt2src"
) -> list[Link]:
    """Hard word links from a soft word alignment, sorted as (source word, target word) pairs.

    `tgt2src` links each target word to its highest-weighted source word, `src2tgt` each source
    word to its highest-weighted target word, `intersect` keeps the links both agree on. Ties go to
    the lower index. A row (or column) without any positive weight, as when all of a word's
    attention sat on EOS and was dropped, gives no link.

    Args:
        word_matrix: (T_words, S_words) from `merge_to_words`, or (T_words, N, S_words), whose
            heads are averaged first.
        direction: "tgt2src", "src2tgt" or "intersect".
    """
    if word_matrix.dim() == 3:
        word_matrix = word_matrix.mean(1)  # (T_words, S_words)
    if word_matrix.dim() != 2:
        raise ValueError(f"expected (T, S) or (T, N, S), got shape {tuple(word_matrix.shape)}")
    if direction not in ("tgt2src", "src2tgt", "intersect"):
        raise ValueError(f"direction must be tgt2src, src2tgt or intersect, got {direction!r}")
    if word_matrix.numel() == 0:
        return []
    best, src_of_tgt = word_matrix.max(dim=1)  # (T_words,) each target word's best source word
    tgt2src = {(int(s), t) for t, s in enumerate(src_of_tgt.tolist()) if best[t] > 0}
    best, tgt_of_src = word_matrix.max(dim=0)  # (S_words,) each source word's best target word
    src2tgt = {(s, int(t)) for s, t in enumerate(tgt_of_src.tolist()) if best[s] > 0}
    chosen = {"tgt2src": tgt2src, "src2tgt": src2tgt, "intersect": tgt2src & src2tgt}[direction]
    return sorted(chosen)


Join = Literal["intersect", "union", "grow-diag-final", "grow-diag-final-and"]
# What a model's word alignments are read from: its own attention, or a foresight head fitted beside it
# (seq2seq.models.foresight); seq2seq.decoding.translator reads either.
Reading = Literal["attention", "foresight"]
READINGS: tuple[Reading, ...] = ("attention", "foresight")
JOINS: tuple[Join, ...] = ("intersect", "union", "grow-diag-final", "grow-diag-final-and")


def symmetrize(
    fwd: Iterable[Link], rev: Iterable[Link], method: Join = "grow-diag-final-and"
) -> list[Link]:
    """One set of (source word, target word) links from an aligner's two directions, sorted.

    `intersect` keeps the links both directions found: precise, sparse; `union` keeps every link
    either found. `grow-diag-final` and `grow-diag-final-and` (Koehn et al. 2005, as fast_align's
    atools) start from the intersection and add links of the union: first, repeatedly, each union
    link that neighbours a chosen link (sideways or diagonally) and has a word not yet aligned on
    either side (grow-diag); then each remaining link of the forward, then of the reverse direction
    with a word still unaligned (final) or with both words still unaligned (final-and). Links are
    visited in sorted order, so the result does not depend on input order.

    Args:
        fwd, rev: the two directions' links, both written (source word, target word).
        method: one of JOINS.
    """
    if method not in JOINS:
        raise ValueError(f"method must be one of {', '.join(JOINS)}, got {method!r}")
    fwd, rev = set(fwd), set(rev)
    links, union = fwd & rev, fwd | rev
    if method in ("intersect", "union"):
        return sorted(links if method == "intersect" else union)
    src_done, tgt_done = {s for s, _ in links}, {t for _, t in links}

    def add(link: Link) -> None:
        links.add(link)
        src_done.add(link[0])
        tgt_done.add(link[1])

    grown = True
    while grown:  # grow-diag: until a pass adds nothing
        grown = False
        for s, t in sorted(links):
            for ds, dt in NEIGHBOURS:
                new = (s + ds, t + dt)
                free = new[0] not in src_done or new[1] not in tgt_done
                if new in union and new not in links and free:
                    add(new)
                    grown = True
    both = method == "grow-diag-final-and"
    for side in (fwd, rev):  # final: a word still unaligned; final-and: both
        for s, t in sorted(side - links):
            free = (s not in src_done, t not in tgt_done)
            if all(free) if both else any(free):
                add((s, t))
    return sorted(links)


def flip(links: Iterable[Link]) -> list[Link]:
    """Links of the reverse direction, (target word, source word), written (source, target)."""
    return sorted((t, s) for s, t in links)


def format_pharaoh(links: Iterable[Link]) -> str:
    """One Pharaoh line, "0-0 1-2 ...": source-target pairs, sorted, each once."""
    return " ".join(f"{src}-{tgt}" for src, tgt in sorted(set(links)))


def read_pharaoh(path: str | Path) -> list[tuple[set[Link], set[Link]]]:
    """Read a gold alignment file: one line per sentence pair, plain or gzip.

    `i-j` is a sure link and `ipj` a possible one; sure links count as possible too, so each
    line gives (sure, possible) with sure ⊆ possible. An empty line is a pair without links.

    Raises:
        UserError: a token that is neither form, naming the file and line.
    """
    return parse_pharaoh(read_lines(path), str(path))


def parse_pharaoh(lines: Iterable[str], path: str) -> list[tuple[set[Link], set[Link]]]:
    """`read_pharaoh` on lines already read; `path` names them in the message."""
    gold = []
    for number, line in enumerate(lines, start=1):
        sure, possible = set(), set()
        for token in line.split():
            match = _LINK.fullmatch(token)
            if match is None:
                raise UserError(
                    f"{path} line {number}: bad alignment link {token!r} (expected i-j or ipj)"
                )
            link = (int(match[1]), int(match[3]))
            possible.add(link)
            if match[2] == "-":
                sure.add(link)
        gold.append((sure, possible))
    return gold


@dataclass(frozen=True)
class AERScore:
    """Corpus-level scores and the counts behind them (A hypothesis, S sure, P possible)."""

    precision: float
    recall: float
    aer: float
    hyp_links: int  # |A|
    sure_links: int  # |S|
    sure_hits: int  # |A∩S|
    possible_hits: int  # |A∩P|


def alignment_error_rate(
    hyps: Sequence[Iterable[Link]], gold: Sequence[tuple[set[Link], set[Link]]]
) -> AERScore:
    """AER of hypothesis links against gold (sure, possible) sets, summed over the corpus.

    An empty denominator has a vacuous answer: no hypothesis links give precision 1.0 (nothing
    claimed was wrong), no sure links give recall 1.0, and both empty give AER 0.0. The counts
    in the result show when that happened.

    Args:
        hyps: per sentence, its (source, target) links.
        gold: per sentence, (sure, possible) as from `read_pharaoh`.

    Raises:
        UserError: hyps and gold cover different numbers of sentences.
    """
    if len(hyps) != len(gold):
        raise UserError(
            f"alignment: {len(hyps)} hypothesis sentences but {len(gold)} gold sentences"
        )
    a = s = a_s = a_p = 0
    for links, (sure, possible) in zip(hyps, gold, strict=True):
        links = set(links)
        a, s = a + len(links), s + len(sure)
        a_s += len(links & sure)
        a_p += len(links & (possible | sure))  # sure links are possible even if a file omits them
    precision = a_p / a if a else 1.0
    recall = a_s / s if s else 1.0
    aer = 1.0 - (a_s + a_p) / (a + s) if a + s else 0.0
    return AERScore(precision, recall, aer, a, s, a_s, a_p)


def word_alignment(
    weights: Tensor,
    source: str,
    src_spans: Sequence[tuple[int, int]],
    target: str,
    tgt_spans: Sequence[tuple[int, int]],
    direction: str = "tgt2src",
) -> tuple[Tensor, list[Link]]:
    """Word-level soft and hard alignment from subword attention (seq2seq.decoding.translator's docstring).

    Args:
        weights: (T, [N,] S) attention; its last row and column are EOS, the others the subwords
            of `target` and `source`, whose (start, end) characters are `tgt_spans`, `src_spans`.
            Heads are averaged: pass a model's `alignment_view` to read its chosen head.
        direction: "tgt2src", "src2tgt" or "intersect" (seq2seq.alignment.words.hard_links).

    Returns:
        (len(target.split()), len(source.split())) weights, heads averaged and EOS dropped, and
        the (source word, target word) links.
    """
    src_of = [*word_spans_in_text(source, src_spans), NOT_A_WORD]  # EOS belongs to no word
    tgt_of = [*word_spans_in_text(target, tgt_spans), NOT_A_WORD]
    mean = weights.mean(1) if weights.dim() == 3 else weights  # (T, S): heads averaged
    words = merge_to_words(mean.float(), src_of, tgt_of)  # (T_w, S_w) up to the last covered word
    missing = (len(source.split()) - words.size(1), len(target.split()) - words.size(0))
    words = F.pad(words, (0, missing[0], 0, missing[1]))  # (len(target words), len(source words))
    return words, hard_links(words, direction)
