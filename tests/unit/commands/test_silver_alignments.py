"""`seq2seq silver-alignments` writes what seq2seq.alignment.silver returns, whole or not at all
(a stand-in aligner: eflomal is optional)."""

import os
from pathlib import Path

import pytest

from seq2seq.commands import silver_alignments


@pytest.fixture
def split(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Flags for a two-pair training split whose stand-in links are 0-0 in each pair."""
    for lang, lines in (("de", ["ein hund", "zwei hunde"]), ("en", ["a dog", "two dogs"])):
        (tmp_path / f"train.{lang}").write_text("".join(x + "\n" for x in lines), "utf-8")
    links = [{(0, 0)}, {(0, 0)}]
    monkeypatch.setattr("seq2seq.alignment.silver.align_both_ways", lambda s, t: (links, links))
    return ["--split", "train", "--train-src", str(tmp_path / "train.de"),
            "--train-tgt", str(tmp_path / "train.en")]  # fmt: skip


def test_the_links_file_is_written_and_summed_up(split: list[str], tmp_path: Path, capsys) -> None:
    out = tmp_path / "links.align"
    assert silver_alignments.main([*split, "--out", str(out)]) == 0
    assert out.read_text("utf-8") == "0-0\n0-0\n"
    assert capsys.readouterr().err.startswith(f"{out}: 2 lines, 1.00 links per sentence, 0 extra")


def test_a_write_that_fails_before_its_fsync_leaves_the_old_file_and_no_temporary(
    split: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    out = tmp_path / "links.align"
    out.write_text("the old links\n", "utf-8")

    def full_disk(fd: int) -> None:
        raise OSError(28, os.strerror(28))

    monkeypatch.setattr(os, "fsync", full_disk)  # seq2seq.atomic fsyncs before it renames
    assert silver_alignments.main([*split, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: --out {out}: cannot write ({os.strerror(28)})"
    assert out.read_text("utf-8") == "the old links\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["links.align", "train.de", "train.en"]


def test_an_out_that_cannot_be_written_is_refused_before_aligning(
    split: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    def no_alignment(*args: object) -> None:
        raise AssertionError("eflomal ran before --out was checked")

    monkeypatch.setattr("seq2seq.alignment.silver.align_both_ways", no_alignment)
    (tmp_path / "a-file").write_text("", "utf-8")
    for out, message in ((tmp_path, "a folder, not a file"),
                         (tmp_path / "train.en", f"is the input {tmp_path / 'train.en'}"),
                         (tmp_path / "a-file" / "x.align", "is a file, not a folder")):  # fmt: skip
        assert silver_alignments.main([*split, "--out", str(out)]) == 2
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and err[0].startswith(f"error: --out {out}: ") and message in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "train.de", "train.en"]


@pytest.mark.parametrize("flag", ["--src-file", "--tgt-file"])
def test_a_test_file_with_split_train_is_refused_before_aligning(
    split: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys, flag: str
) -> None:
    def no_alignment(*args: object) -> None:
        raise AssertionError("eflomal ran on the training set, the test file unread")

    monkeypatch.setattr("seq2seq.alignment.silver.align_both_ways", no_alignment)
    out = tmp_path / "links.align"
    argv = [*split, flag, str(tmp_path / "train.de"), "--out", str(out)]
    assert silver_alignments.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err
        == f"error: {flag} is the test set's: --split train aligns --train-src and --train-tgt alone"
    )
    assert not out.exists()
