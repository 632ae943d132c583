"""seq2seq.alignment.silver: eflomal's links for a split, called with values (a stand-in aligner:
eflomal is optional), its typed result, and the refusals (the command's file: tests/unit/commands)."""

from pathlib import Path

import pytest

from seq2seq.alignment import silver
from seq2seq.alignment.silver import SilverLinks, silver_alignments
from seq2seq.errors import UserError


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), "utf-8")
    return path


def stand_in(fwd: list[set], rev: list[set], seen: list) -> object:
    def align_both_ways(src: list[str], tgt: list[str]) -> tuple[list[set], list[set]]:
        seen.append((src, tgt))
        return fwd, rev

    return align_both_ways


def test_a_test_split_is_aligned_beside_the_extra_pairs_and_only_its_lines_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = write(tmp_path / "test.de", ["ein hund", "", "zwei hunde"])
    tgt = write(tmp_path / "test.en", ["a dog", "x", "two dogs"])
    extra = (write(tmp_path / "train.de", ["der mann"]), write(tmp_path / "train.en", ["the man"]))
    seen: list = []
    fwd = [{(0, 0)}, {(0, 0), (1, 1)}, {(0, 0), (1, 1)}]  # extra pair, then the two real ones
    rev = [{(1, 1)}, {(0, 0)}, {(0, 0), (1, 1), (0, 1)}]
    monkeypatch.setattr(silver, "align_both_ways", stand_in(fwd, rev, seen))
    links = silver_alignments(src, tgt, extra, "intersect", with_possible=True)
    assert seen == [(["der mann", "ein hund", "zwei hunde"], ["the man", "a dog", "two dogs"])]
    assert isinstance(links, SilverLinks) and links.extra_pairs == 1 and links.seconds >= 0
    # Pair 0: both agree on 0-0, 1-1 only forward (possible); pair 1 blank; pair 2: 0-1 only back.
    assert links.lines == ("0-0 1p1", "", "0-0 1-1 0p1")
    assert links.links_per_sentence == pytest.approx(5 / 3)
    assert links.text() == "0-0 1p1\n\n0-0 1-1 0p1\n"
    sure = silver_alignments(src, tgt, extra, "intersect")
    assert sure.lines == ("0-0", "", "0-0 1-1")


def test_links_outside_a_sentence_and_mismatched_files_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = write(tmp_path / "test.de", ["ein hund", "zwei hunde"])
    tgt = write(tmp_path / "test.en", ["a dog", "two dogs"])
    wide = [{(0, 0)}, {(0, 5)}]  # target word 5 of "two dogs" does not exist
    monkeypatch.setattr(silver, "align_both_ways", stand_in(wide, wide, []))
    with pytest.raises(UserError, match=r"test\.de line 2: link 0-5 is outside the sentence"):
        silver_alignments(src, tgt)
    short = write(tmp_path / "short.en", ["a dog"])
    with pytest.raises(UserError, match=r"test\.de has 2 lines but .*short\.en has 1"):
        silver_alignments(src, short)


def test_eflomal_links_files_are_read_source_target_and_counted(tmp_path: Path) -> None:
    links = write(tmp_path / "fwd", ["0-0 1-2", ""])
    assert silver.read_links(links, 2) == [{(0, 0), (1, 2)}, set()]
    with pytest.raises(UserError, match="eflomal wrote 2 fwd lines for 3 sentence pairs"):
        silver.read_links(links, 3)
    with pytest.raises(UserError, match="eflomal wrote no rev links"):
        silver.read_links(tmp_path / "rev", 2)
