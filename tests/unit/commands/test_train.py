"""scripts/train.py's refusals, in-process: a mismatched corpus and a bad flag value (runs on the tiny
corpus: tests/e2e/test_train.py)."""

# Imported at collection, as other test modules import it when the whole suite runs: Lightning's
# log handler then holds pytest's stderr, not the one capsys gives the first test to build a Trainer.
import lightning.pytorch  # noqa: F401

from seq2seq.commands import train
from tests.conftest import tiny_train_args, write_corpus


def test_mismatched_corpus_is_refused_with_both_counts(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    corpus = write_corpus(tmp_path / "bad", {"train": 30, "val": 5})
    lines = (corpus / "train.en").read_text().splitlines()
    (corpus / "train.en").write_text("\n".join(lines[:-1]) + "\n")
    assert train.main(tiny_train_args(corpus, tmp_path / "runs")) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "30" in err and "29" in err and "Traceback" not in err
    assert not (tmp_path / "runs").exists()  # nothing half-written


def test_bad_flag_value_is_one_line_exit_2(tmp_path, capsys):
    assert train.main(["--batch-tokens", "-5", "--log-dir", str(tmp_path / "runs")]) == 2
    assert capsys.readouterr().err.strip() == "error: --batch-tokens must be positive, got -5"
