"""The recipe search's flags in a run: the latest checkpoints kept for averaging, and the validation
search's length penalty."""

import torch

from seq2seq.commands import train
from seq2seq.study.scoring import best_checkpoints
from tests.conftest import tiny_train_args


def test_keep_last_keeps_the_latest_validations_and_scoring_finds_them(
    tiny_corpus, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    args = tiny_train_args(tiny_corpus, tmp_path / "runs", "--max-steps", "40", "--val-every", "10",
                           "--max-epochs", "1000", "--keep-last", "2", "--keep-best", "1",
                           "--word-dropout", "0.1", "--val-beam", "2",
                           "--val-length-penalty", "0.6")  # fmt: skip
    assert train.main(args) == 0
    folder = tmp_path / "runs" / "rnn-additive" / "version_0" / "checkpoints"
    assert sorted(p.name for p in folder.glob("recent-*.ckpt")) == [
        "recent-30.ckpt",
        "recent-40.ckpt",
    ]
    last = torch.load(folder / "last.ckpt", map_location="cpu", weights_only=True)
    recent = best_checkpoints(folder, last, monitor="step")
    assert [path.name for path, _ in recent] == ["recent-40.ckpt", "recent-30.ckpt"]
    best = best_checkpoints(folder, last)
    assert len(best) == 1 and best[0][0].name.startswith("best-")
    hparams = last["hyper_parameters"]
    assert (hparams["word_dropout"], hparams["val_length_penalty"]) == (0.1, 0.6)
