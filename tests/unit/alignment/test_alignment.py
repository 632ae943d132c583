"""Word alignments: pieces to words, EOS dropped, hard links, Pharaoh files, AER by hand."""

from pathlib import Path

import pytest
import torch

from seq2seq.alignment.words import (
    alignment_error_rate,
    flip,
    format_pharaoh,
    hard_links,
    merge_to_words,
    read_pharaoh,
    symmetrize,
)
from seq2seq.data.words import check_links_fit
from seq2seq.errors import UserError

# The word of each piece (-1: EOS), as word_spans_in_text gives them (tests/unit/decoding/test_translator.py).
SRC = [0, 1, 1, 2, -1]  # ▁Ein ▁klein er ▁Hund </s>: Ein kleiner Hund
TGT = [0, 1, 2, 2, -1]  # ▁A ▁small ▁do g </s>: A small dog
WEIGHTS = torch.tensor(  # (T, S); rows sum to 1, EOS column last
    [
        [0.6, 0.1, 0.1, 0.0, 0.2],  # ▁A
        [0.0, 0.3, 0.4, 0.1, 0.2],  # ▁small
        [0.1, 0.0, 0.0, 0.5, 0.4],  # ▁do
        [0.0, 0.1, 0.1, 0.7, 0.1],  # g
        [0.0, 0.0, 0.0, 0.1, 0.9],  # </s>
    ]
)


def test_merge_sums_source_pieces_averages_target_pieces_and_drops_eos() -> None:
    words = merge_to_words(WEIGHTS, SRC, TGT)
    expected = torch.tensor(  # columns: Ein, klein+er, Hund; EOS column and row gone
        [
            [0.6, 0.2, 0.0],  # A
            [0.0, 0.7, 0.1],  # small
            [0.05, 0.1, 0.6],  # (do + g) / 2 = ([0.1, 0, 0.5] + [0, 0.2, 0.7]) / 2
        ]
    )
    torch.testing.assert_close(words, expected)
    summed = merge_to_words(WEIGHTS, SRC, TGT, reduce="sum")
    torch.testing.assert_close(summed[2], torch.tensor([0.1, 0.2, 1.2]))
    renormed = merge_to_words(WEIGHTS, SRC, TGT, renormalize=True)
    torch.testing.assert_close(renormed[0], torch.tensor([0.75, 0.25, 0.0]))  # / (1 - 0.2)
    torch.testing.assert_close(renormed.sum(-1), torch.ones(3))


def test_merge_keeps_heads_and_zero_rows_stay_zero_when_renormalized() -> None:
    per_head = torch.stack([WEIGHTS, WEIGHTS.flip(-1)], dim=1)  # (T, N=2, S)
    words = merge_to_words(per_head, SRC, TGT)
    assert words.shape == (3, 2, 3)
    for head in range(2):
        alone = merge_to_words(per_head[:, head], SRC, TGT)
        torch.testing.assert_close(words[:, head], alone)
    only_eos = torch.zeros(2, 3)  # (T, S): all mass on the EOS column
    only_eos[:, -1] = 1
    merged = merge_to_words(only_eos, [0, 1, -1], [0, -1], renormalize=True)
    assert merged.tolist() == [[0.0, 0.0]]


def test_merge_rejects_mismatched_word_indices() -> None:
    with pytest.raises(ValueError, match="do not match"):
        merge_to_words(WEIGHTS, SRC[:-1], TGT)


MATRIX = torch.tensor(  # (T_words, S_words)
    [
        [0.6, 0.3, 0.1],
        [0.5, 0.2, 0.3],
        [0.0, 0.1, 0.9],
        [0.0, 0.0, 0.0],  # a target word whose attention was all on EOS
    ]
)


def test_hard_links_in_each_direction() -> None:
    # rows' argmax: t0->s0, t1->s0, t2->s2, t3 none; columns' argmax: s0->t0, s1->t0, s2->t2
    assert hard_links(MATRIX, "tgt2src") == [(0, 0), (0, 1), (2, 2)]
    assert hard_links(MATRIX, "src2tgt") == [(0, 0), (1, 0), (2, 2)]
    assert hard_links(MATRIX, "intersect") == [(0, 0), (2, 2)]
    assert hard_links(torch.zeros(0, 3)) == []


def test_hard_links_average_heads_first() -> None:
    heads = torch.stack([MATRIX, MATRIX.roll(1, dims=-1)], dim=1)  # (T, N=2, S)
    for direction in ("tgt2src", "src2tgt", "intersect"):
        assert hard_links(heads, direction) == hard_links(heads.mean(1), direction)
    assert hard_links(heads) != hard_links(MATRIX)  # the second head does change the answer


def test_pharaoh_round_trip(tmp_path: Path) -> None:
    sentences = [[(2, 1), (0, 0), (2, 1), (1, 3)], [], [(10, 0)]]
    lines = [format_pharaoh(links) for links in sentences]
    assert lines == ["0-0 1-3 2-1", "", "10-0"]  # sorted, each link once, source first
    path = tmp_path / "hyp.align"
    path.write_text("".join(line + "\n" for line in lines), "utf-8")
    gold = read_pharaoh(path)
    assert [sure for sure, _ in gold] == [set(links) for links in sentences]
    assert [possible for _, possible in gold] == [set(links) for links in sentences]


@pytest.mark.parametrize("token", ["2x3", "1-", "-1-2", "a-b", "1-2-3", "1P2"])
def test_malformed_gold_line_names_file_and_line(tmp_path: Path, token: str) -> None:
    path = tmp_path / "gold.align"
    path.write_text(f"0-0\n\n1-1 {token}\n", "utf-8")
    with pytest.raises(UserError, match=rf"gold\.align line 3: .*{token!r}"):
        read_pharaoh(path)


def test_a_link_past_either_sentence_is_refused_naming_the_line() -> None:
    src, tgt = ["ein hund", "zwei kleine hunde"], ["a dog", "two dogs"]
    fits = [{(0, 0), (1, 1)}, {(2, 1), (0, 0)}]  # the last word of each side
    check_links_fit(fits, src, tgt, "gold.align")
    for wide, said in (
        ({(3, 0)}, "link 3-0 is outside the sentence pair (3 source words, 2 target words)"),
        ({(0, 2)}, "link 0-2 is outside the sentence pair (3 source words, 2 target words)"),
    ):
        with pytest.raises(UserError) as refused:
            check_links_fit([fits[0], wide], src, tgt, "gold.align")
        assert str(refused.value) == f"gold.align line 2: {said}"
    # Targets not known yet (a model's own translations): source words alone are checked.
    check_links_fit([{(0, 9)}, {(2, 9)}], src, None, "gold.align")
    with pytest.raises(UserError, match=r"^g line 8: link 3-0 is outside .* \(3 source words\)$"):
        check_links_fit([{(3, 0)}], src[1:], None, "g", first=8)


def test_aer_by_hand(tmp_path: Path) -> None:
    gold_file = tmp_path / "gold.align"
    gold_file.write_text("0-0 1p1 1-2\n\n0-1 1p0 2p2\n", "utf-8")
    gold = read_pharaoh(gold_file)
    assert gold[0] == ({(0, 0), (1, 2)}, {(0, 0), (1, 1), (1, 2)})  # sure links are possible too
    assert gold[1] == (set(), set())
    hyps = [{(0, 0), (1, 1), (2, 2)}, set(), {(0, 1), (2, 2)}]
    # sentence 1: A∩S = {0-0} -> 1, A∩P = {0-0, 1-1} -> 2, |A| = 3, |S| = 2
    # sentence 2: nothing
    # sentence 3: A∩S = {0-1} -> 1, A∩P = {0-1, 2-2} -> 2, |A| = 2, |S| = 1
    # totals: |A| = 5, |S| = 3, |A∩S| = 2, |A∩P| = 4
    # precision = 4/5 = 0.8, recall = 2/3, AER = 1 - (2 + 4) / (5 + 3) = 1 - 6/8 = 0.25
    score = alignment_error_rate(hyps, gold)
    assert (score.hyp_links, score.sure_links, score.sure_hits, score.possible_hits) == (5, 3, 2, 4)
    assert score.precision == pytest.approx(0.8)
    assert score.recall == pytest.approx(2 / 3)
    assert score.aer == pytest.approx(0.25)
    assert alignment_error_rate([sorted(h) for h in hyps], gold) == score  # lists work as sets
    perfect = alignment_error_rate([sure for sure, _ in gold], gold)
    assert (perfect.precision, perfect.recall, perfect.aer) == (1.0, 1.0, 0.0)


def test_aer_zero_denominators_and_length_mismatch() -> None:
    empty = alignment_error_rate([set(), set()], [(set(), set()), (set(), set())])
    assert (empty.precision, empty.recall, empty.aer) == (1.0, 1.0, 0.0)
    silent = alignment_error_rate([set()], [({(0, 0)}, {(0, 0)})])  # nothing proposed
    assert (silent.recall, silent.aer) == (0.0, 1.0)
    only_possible = alignment_error_rate([{(0, 0), (1, 1)}], [(set(), {(0, 0)})])  # no sure links
    assert (only_possible.precision, only_possible.aer) == (0.5, 0.5)
    with pytest.raises(UserError, match="2 hypothesis sentences but 1 gold"):
        alignment_error_rate([set(), set()], [(set(), set())])


def test_symmetrize_by_hand() -> None:
    # Five source and five target words; links are (source, target).
    fwd = {(0, 0), (1, 1), (2, 1), (4, 4)}
    rev = {(0, 0), (1, 1), (0, 1), (3, 4)}
    # intersection: {0-0, 1-1}; union adds 2-1, 4-4 (forward only) and 0-1, 3-4 (reverse only).
    assert symmetrize(fwd, rev, "intersect") == [(0, 0), (1, 1)]
    # grow-diag, from the intersection:
    #   0-1 neighbours 0-0 and 1-1, but source 0 and target 1 are both aligned already: not added;
    #   2-1 neighbours 1-1 (below it) and source 2 is unaligned: added;
    #   nothing else in the union touches 0-0, 1-1 or 2-1 (4-4 and 3-4 are far off): done.
    # final-and, forward first: 4-4 has both words unaligned: added. Then reverse: 3-4 has an
    #   unaligned source word 3 but target 4 is now aligned: "and" needs both free, not added
    #   (plain "final" would add it).
    assert symmetrize(fwd, rev) == [(0, 0), (1, 1), (2, 1), (4, 4)]
    assert symmetrize(rev, fwd) == [(0, 0), (1, 1), (2, 1), (3, 4)]  # reverse first: 3-4 wins
    # grow-diag takes diagonal neighbours and repeats until nothing changes: a chain from 0-0.
    chain = {(0, 0), (1, 1), (2, 2), (3, 3)}
    assert symmetrize({(0, 0)}, chain) == sorted(chain)
    # union: every link of either direction.
    assert symmetrize(fwd, rev, "union") == [(0, 0), (0, 1), (1, 1), (2, 1), (3, 4), (4, 4)]
    # grow-diag-final: the same grow-diag; then forward 4-4 (both free) is added, and reverse 3-4
    #   too, as its source word 3 is still unaligned ("final" needs one free word, not both).
    assert symmetrize(fwd, rev, "grow-diag-final") == [(0, 0), (1, 1), (2, 1), (3, 4), (4, 4)]
    with pytest.raises(ValueError, match="grow-diag-final-and"):
        symmetrize(fwd, rev, "grow-diag")
    assert flip([(0, 1), (2, 0)]) == [(0, 2), (1, 0)]


def _word_spans_by_character(text: str, spans: list[tuple[int, int]]) -> list[int]:
    """An independent reference for word_spans_in_text: a word index per character, then for each
    piece the first word among its characters, and the same joining of word-less pieces."""
    word_at, word = [], -1
    for i, char in enumerate(text):
        if not char.isspace() and (i == 0 or text[i - 1].isspace()):
            word += 1
        word_at.append(-1 if char.isspace() else word)
    words = [next((w for w in word_at[s:e] if w != -1), -1) for s, e in spans]
    for i in range(len(words)):  # a word-less piece joins the next piece's word ...
        if words[i] == -1:
            words[i] = next((w for w in words[i + 1 :] if w != -1), -1)
    for i in range(len(words)):  # ... or, at the end, the previous one
        if words[i] == -1:
            words[i] = next((w for w in reversed(words[:i]) if w != -1), -1)
    return words


def test_word_spans_agree_with_a_character_by_character_reference() -> None:
    import random
    import re

    from seq2seq.data.words import word_spans_in_text

    chars = [chr(c) for c in range(0x3000 + 1)]  # every space character is below U+3001
    assert all(bool(re.fullmatch(r"\s", c)) == c.isspace() for c in chars)  # as str.split()
    spaces = [c for c in chars if c.isspace()]
    rng = random.Random(0)
    alphabet = ["a", "b", "ü", "☃", "\u200b", "\x01", *spaces[:6], "\u3000"]
    for _ in range(2000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
        cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randint(1, 6))))
        spans = list(zip(cuts, cuts[1:], strict=False)) + [(len(text), len(text))] * rng.randint(
            0, 1
        )
        assert word_spans_in_text(text, spans) == _word_spans_by_character(text, spans), (
            text,
            spans,
        )
