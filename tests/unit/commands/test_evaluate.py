"""`seq2seq evaluate` writes what seq2seq.decoding.evaluate returns: the hypotheses and the JSON
(whose keys studies read), each whole or not at all (on a trained checkpoint:
tests/e2e/test_evaluate.py)."""

import json
import os
from pathlib import Path

import pytest

from seq2seq.commands import evaluate as evaluate_command
from seq2seq.decoding.evaluate import EvalOptions, evaluate
from seq2seq.decoding.search_config import SearchConfig
from tests.conftest import write_corpus

KEYS = ["checkpoint", "data", "bleu", "bleu_signature", "brevity_penalty", "hyp_len", "ref_len",
        "chrf", "chrf_signature", "sentences", "seconds", "sentences_per_second", "beam",
        "length_penalty", "device", "hypotheses"]  # fmt: skip
ALIGN_KEYS = ["aer", "align_precision", "align_recall", "align_links", "align_ref", "align_on",
              "align_reading"]  # fmt: skip


@pytest.fixture
def run_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The premove checkpoint names the corpus `corpus` (relative): write it in a fresh folder."""
    monkeypatch.chdir(tmp_path)
    write_corpus(tmp_path / "corpus")
    return tmp_path


def test_the_hypotheses_and_the_json_are_the_procedures_figures(
    premove_checkpoint: Path, run_folder: Path, capsys: pytest.CaptureFixture
) -> None:
    argv = [str(premove_checkpoint), "--beam", "2", "--out", "hyps.txt", "--json", "result.json"]
    assert evaluate_command.main(argv) == 0
    result = json.loads(Path("result.json").read_text("utf-8"))
    assert list(result) == KEYS
    found = evaluate(premove_checkpoint, options=EvalOptions(search=SearchConfig(beam=2)))
    assert Path("hyps.txt").read_text("utf-8").splitlines() == list(found.hypotheses)
    assert result["hypotheses"] == "hyps.txt" and result["sentences"] == 20 == found.sentences
    assert (result["bleu"], result["bleu_signature"]) == (found.bleu.value, found.bleu.signature)
    assert (result["chrf"], result["beam"], result["device"]) == (found.chrf.value, 2, "cpu")
    assert f"BLEU = {found.bleu.value:.2f}  {found.bleu.signature}" in capsys.readouterr().out
    gold = run_folder / "gold.align"
    gold.write_text("0-0\n" * 20, "utf-8")
    assert evaluate_command.main([*argv, "--align-ref", str(gold), "--json", "-"]) == 0
    result = json.loads(capsys.readouterr().out)  # stdout is the JSON alone
    assert list(result) == KEYS + ALIGN_KEYS and result["align_ref"] == str(gold)


def test_a_write_that_fails_before_its_fsync_leaves_the_old_files(
    premove_checkpoint: Path, run_folder: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    Path("hyps.txt").write_text("the old hypotheses\n", "utf-8")

    def full_disk(fd: int) -> None:
        raise OSError(28, os.strerror(28))

    monkeypatch.setattr(os, "fsync", full_disk)  # seq2seq.atomic fsyncs before it renames
    argv = [str(premove_checkpoint), "--beam", "1", "--out", "hyps.txt", "--json", "result.json"]
    assert evaluate_command.main(argv) == 2
    assert (
        capsys.readouterr().err.strip()
        == f"error: --out hyps.txt: cannot write ({os.strerror(28)})"
    )
    assert Path("hyps.txt").read_text("utf-8") == "the old hypotheses\n"
    assert sorted(p.name for p in run_folder.iterdir()) == ["corpus", "hyps.txt"]  # no temporary


def test_an_out_or_json_that_cannot_be_written_is_refused_before_translating(
    premove_checkpoint: Path, run_folder: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    def no_translation(*args: object, **kwargs: object) -> None:
        raise AssertionError("translated before --out and --json were checked")

    monkeypatch.setattr(evaluate_command, "evaluate", no_translation)
    Path("a-file").write_text("", "utf-8")
    src, ref = (str(run_folder / "corpus" / f"test.{lang}") for lang in ("de", "en"))
    files, kept = ["--src-file", src, "--ref-file", ref], Path(ref).read_bytes()
    for flags, message in (([*files, "--out", ref], f"error: --out {ref}: is the input {ref}"),
                           ([*files, "--json", src], f"error: --json {src}: is the input {src}"),
                           (["--out", "."], "error: --out .: a folder, not a file"),
                           (["--out", "a-file/h.txt"], "error: --out a-file/h.txt: a-file is a file"),
                           (["--json", "a-file/r.json"], "error: --json a-file/r.json: a-file is a")):  # fmt: skip
        assert evaluate_command.main([str(premove_checkpoint), "--beam", "1", *flags]) == 2
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and err[0].startswith(message), err
    assert sorted(p.name for p in run_folder.iterdir()) == ["a-file", "corpus"]
    assert Path(ref).read_bytes() == kept
    # /dev/null is written into as it is, never replaced: it passes the check, on to the translation.
    with pytest.raises(AssertionError, match="translated before"):
        evaluate_command.main([str(premove_checkpoint), "--out", "/dev/null"])
