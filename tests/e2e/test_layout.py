"""A run saved before the package moved into sub-packages resumes to its new end."""

from pathlib import Path

import pytest
import torch

from seq2seq.commands import train as train_command
from tests.conftest import PREMOVE_SIZES, tiny_train_args, write_corpus


def test_a_run_saved_before_the_move_resumes_to_its_new_end(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    premove_checkpoint: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)  # the data cache goes to ./data/cache
    corpus = write_corpus(tmp_path / "corpus")  # the fixture's corpus: seeded, the same pairs
    runs = tmp_path / "runs"
    args = tiny_train_args(corpus, runs, "--max-steps", "30", "--max-epochs", "1000",
                           "--val-every", "10", "--seed", "1", *PREMOVE_SIZES,
                           "--resume", str(premove_checkpoint))  # fmt: skip
    # It trained with 0.2.0's recipe, which a resume must be given (a run keeps its recipe).
    assert train_command.main(args) == 2
    assert "trained with --dropout 0.3, --lr 0.001, --word-dropout 0.0" in capsys.readouterr().err
    args += ["--dropout", "0.3", "--lr", "1e-3", "--word-dropout", "0"]
    assert train_command.main(args) == 0
    last = torch.load(next(runs.rglob("last.ckpt")), weights_only=True)
    assert last["global_step"] == 30
    before = torch.load(premove_checkpoint, weights_only=True)
    assert before["global_step"] == 20
    moved = [k for k in last["state_dict"] if not torch.equal(last["state_dict"][k],
                                                              before["state_dict"][k])]  # fmt: skip
    assert moved, "ten more updates changed no weight"
