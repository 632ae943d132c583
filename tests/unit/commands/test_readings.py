"""The readings on the command line: `seq2seq fit-foresight` writes a copy with a head; `evaluate
--align-reading foresight` and `--reverse` print an AER line a reading, named; `translate
--align-reading foresight` and `--reverse` label what they print."""

import json
from pathlib import Path

import pytest
import torch

from seq2seq.alignment.words import JOINS, format_pharaoh, symmetrize
from seq2seq.commands import evaluate as evaluate_command
from seq2seq.commands import foresight as foresight_command
from seq2seq.commands import translate as translate_command
from seq2seq.decoding.translator import Translator
from tests.conftest import write_corpus

AER_LINE = r"^AER = 0\.\d{4}  precision = \d\.\d{4}  recall = \d\.\d{4}  \((?P<reading>[^;]+); "


@pytest.fixture
def run_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The premove checkpoint names the corpus `corpus` (relative): write it in a fresh folder."""
    monkeypatch.chdir(tmp_path)
    write_corpus(tmp_path / "corpus")
    (tmp_path / "gold.align").write_text("0-0 1-1\n" * 20, "utf-8")
    return tmp_path


def reversed_copy(checkpoint: Path) -> Path:
    """The checkpoint as if it translated en->de (same weights: the vocabulary is joint)."""
    saved = torch.load(checkpoint, weights_only=True)
    corpus = saved["hyper_parameters"]["corpus"]
    corpus["src"], corpus["tgt"] = corpus["tgt"], corpus["src"]
    torch.save(saved, "en-de.ckpt")
    return Path("en-de.ckpt")


def readings_printed(out: str) -> list[str]:
    import re

    return [m["reading"] for m in re.finditer(AER_LINE, out, re.M)]


def test_fit_foresight_writes_a_copy_with_a_head_and_leaves_the_original(
    premove_checkpoint: Path, run_folder: Path, capsys: pytest.CaptureFixture
) -> None:
    before = premove_checkpoint.read_bytes()
    argv = [str(premove_checkpoint), "--out", "fs.ckpt", "--steps", "3", "--batch-tokens", "200"]
    assert foresight_command.main(argv) == 0
    out = capsys.readouterr().out
    assert "(200 pairs)" in out and "fitted: 3 updates" in out and "written: fs.ckpt" in out
    assert premove_checkpoint.read_bytes() == before
    assert Translator.load("fs.ckpt").foresight is not None
    saved = torch.load("fs.ckpt", weights_only=True)
    assert saved["foresight"]["fit"]["steps"] == 3 and saved["foresight"]["fit"]["data"].endswith(
        "train (de-en)"
    )

    gold = str(run_folder / "gold.align")
    common = ["fs.ckpt", "--beam", "1", "--out", "hyps.txt", "--align-ref", gold]
    assert evaluate_command.main([*common, "--align-reading", "foresight"]) == 0
    assert readings_printed(capsys.readouterr().out) == ["foresight"]

    (run_folder / "in.txt").write_text("Ein hund läuft\n\nDer mann sieht ein kind\n", "utf-8")
    argv = ["fs.ckpt", "--input", "in.txt", "--alignments", "soft", "--align-reading", "foresight"]
    assert translate_command.main(argv) == 0
    objects = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [o["reading"] for o in objects] == ["foresight", "foresight", "foresight"]


def test_fit_foresight_refuses_bad_flags_in_one_line(
    premove_checkpoint: Path, run_folder: Path, capsys: pytest.CaptureFixture
) -> None:
    for flags, message in ((["--steps", "0"], "--steps 0: must be at least 1"),
                           (["--threads", "0"], "--threads 0: must be at least 1"),
                           (["--src-file", "corpus/test.de"], "--src-file and --tgt-file go together"),
                           (["--src-file", "corpus/test.de", "--tgt-file", "corpus/test.en",
                             "--split", "val"], "--split names a corpus split: --src-file's are read"),
                           (["--split", "nope"], "(or give --src-file and --tgt-file)")):  # fmt: skip
        assert foresight_command.main([str(premove_checkpoint), "--out", "x.ckpt", *flags]) == 2
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and message in err[0] and "--ref-file" not in err[0], err
    assert not Path("x.ckpt").exists()


def test_more_threads_than_cores_are_taken_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """`--threads` (fit-foresight's, readings_report's) past the cores this process may use: torch
    gets them, and stderr says they will wait on each other; up to the cores, nothing is said."""
    from seq2seq import cli, machine

    monkeypatch.setattr(machine, "cores", lambda: 2)
    before = torch.get_num_threads()
    try:
        cli.use_threads(2)
        assert capsys.readouterr().err == "" and torch.get_num_threads() == 2
        cli.use_threads(3)
        err = capsys.readouterr().err.splitlines()
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)
    assert len(err) == 1 and err[0].startswith("warning: --threads 3 is more than the 2 cores"), err


def test_fit_foresight_refuses_an_out_it_would_lose_the_fit_on_before_fitting(
    premove_checkpoint: Path, run_folder: Path, capsys: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    from seq2seq.alignment import foresight

    def no_fit(*args: object) -> None:
        raise AssertionError("the head was fitted before --out was checked")

    monkeypatch.setattr(foresight, "fit_foresight", no_fit)
    original = premove_checkpoint.read_bytes()
    Path("a-file").write_text("", "utf-8")
    for out, message in ((str(premove_checkpoint), "is the input"),
                         (".", "a folder, not a file"),
                         ("a-file/fs.ckpt", "a-file is a file, not a folder")):  # fmt: skip
        assert foresight_command.main([str(premove_checkpoint), "--out", out]) == 2
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and err[0].startswith(f"error: --out {out}") and message in err[0], err
    assert premove_checkpoint.read_bytes() == original
    assert sorted(p.name for p in Path(".").iterdir()) == ["a-file", "corpus", "gold.align"]


def test_evaluate_with_a_reverse_checkpoint_prints_each_aer(
    premove_checkpoint: Path, run_folder: Path, capsys: pytest.CaptureFixture
) -> None:
    reverse = reversed_copy(premove_checkpoint)
    gold = str(run_folder / "gold.align")
    argv = [str(premove_checkpoint), "--beam", "1", "--out", "hyps.txt", "--align-ref", gold]
    assert evaluate_command.main([*argv, "--reverse", str(reverse), "--json", "r.json"]) == 0
    expected = ["attention", "reverse:attention", *(f"joined:{m}" for m in JOINS)]
    assert readings_printed(capsys.readouterr().out) == expected
    result = json.loads(Path("r.json").read_text("utf-8"))
    assert [r["reading"] for r in result["alignments"]] == expected
    assert (
        result["aer"] == result["alignments"][0]["aer"] and result["align_reading"] == "attention"
    )
    assert evaluate_command.main([*argv[:-2], "--reverse", str(reverse)]) == 2  # no --align-ref
    assert (
        "--reverse is for alignment scoring: give --align-ref GOLD too" in capsys.readouterr().err
    )


def test_translate_with_a_reverse_checkpoint_prints_the_joined_links(
    premove_checkpoint: Path, run_folder: Path, capsys: pytest.CaptureFixture
) -> None:
    lines = ["Ein hund läuft", "Der mann sieht ein kind"]
    (run_folder / "in.txt").write_text("\n".join(lines) + "\n", "utf-8")
    reverse = reversed_copy(premove_checkpoint)
    argv = [str(premove_checkpoint), "--input", "in.txt", "--reverse", str(reverse)]
    assert translate_command.main([*argv, "--alignments", "hard", "--join", "union"]) == 0
    printed = [line.split(" ||| ") for line in capsys.readouterr().out.splitlines()]
    forward, back = Translator.load(premove_checkpoint), Translator.load(reverse)
    for (text, links), result in zip(printed, forward.translate(lines, return_alignments=True),
                                     strict=True):  # fmt: skip
        [read_back] = back.align([result.text], [lines[printed.index([text, links])]])
        flipped = [(s, t) for t, s in read_back.word_alignment]
        assert text == result.text
        assert links == format_pharaoh(symmetrize(result.word_alignment, flipped, "union"))
    assert translate_command.main([*argv, "--alignments", "soft"]) == 0
    objects = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [o["reading"] for o in objects] == ["joined:grow-diag-final-and"] * 2
    assert translate_command.main(argv) == 2  # --reverse without --alignments
    assert (
        "--reverse is for word alignments: give --alignments hard or soft"
        in capsys.readouterr().err
    )
    same_way = [*argv[:3], "--reverse", str(premove_checkpoint), "--alignments", "hard"]
    assert translate_command.main(same_way) == 2  # a --reverse that translates the same way round
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "translates de->en, not en->de" in err[0], err


@pytest.mark.parametrize(
    ("command", "flags", "said"),
    [
        ("translate", ["--join", "union"], "--join is for word alignments: give --alignments hard"),
        ("translate", ["--align-direction", "src2tgt"], "--align-direction is for word alignments"),
        ("translate", ["--align-reading", "foresight"], "--align-reading is for word alignments"),
        ("translate", ["--alignments", "hard", "--join", "union"],
         "--join joins --reverse's links: give --reverse CKPT2 too"),
        ("evaluate", ["--align-on", "hyp"], "--align-on is for alignment scoring: give --align-ref"),
        ("evaluate", ["--align-direction", "intersect"], "--align-direction is for alignment scoring"),
        ("evaluate", ["--align-reading", "foresight"], "--align-reading is for alignment scoring"),
    ],
)  # fmt: skip
def test_a_flag_nothing_would_read_is_refused_before_any_work(
    command: str, flags: list[str], said: str, run_folder: Path, capsys: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """`translate --join union` without --reverse, or `evaluate --align-on hyp` without --align-ref,
    ran and printed what the flag was meant to change, unchanged: each such flag is refused, in one
    line, before the checkpoint is read (here it does not exist). At its default it passes."""
    main = {"translate": translate_command.main, "evaluate": evaluate_command.main}[command]
    assert main(["missing.ckpt", *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {said}"), err
    default = {"--join": "grow-diag-final-and", "--align-direction": "tgt2src",
               "--align-reading": "attention", "--align-on": "ref"}[flags[-2]]  # fmt: skip
    assert main(["missing.ckpt", *flags[:-1], default]) == 2  # on to the checkpoint, not found
    assert "missing.ckpt" in capsys.readouterr().err


def test_translate_names_the_checkpoint_that_holds_no_foresight_head(
    premove_checkpoint: Path, run_folder: Path, capsys: pytest.CaptureFixture
) -> None:
    argv = [str(premove_checkpoint), "--out", "fs.ckpt", "--steps", "2", "--batch-tokens", "200"]
    assert foresight_command.main(argv) == 0
    reverse = str(reversed_copy(premove_checkpoint))  # no head: only fs.ckpt has one
    (run_folder / "in.txt").write_text("Ein hund läuft\n", "utf-8")
    capsys.readouterr()
    flags = ["--input", "in.txt", "--alignments", "hard", "--align-reading", "foresight"]
    for checkpoints, lacking in ((["fs.ckpt", "--reverse", reverse], reverse),
                                 ([str(premove_checkpoint)], str(premove_checkpoint))):  # fmt: skip
        assert translate_command.main([*checkpoints, *flags]) == 2
        assert capsys.readouterr().err.strip() == (
            f"error: --align-reading foresight: {lacking} holds no foresight head "
            "(fit one with `seq2seq fit-foresight`)"
        )
