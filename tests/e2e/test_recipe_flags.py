"""The recipe search's flags in a run: the latest checkpoints kept for averaging (epoch ends, with one
validation an epoch), the validation search's length penalty, and patience on validation loss."""

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


def recent_steps(folder) -> list[int]:
    return sorted(int(p.stem.removeprefix("recent-")) for p in folder.glob("recent-*.ckpt"))


def test_keep_last_with_one_validation_an_epoch_keeps_epoch_end_checkpoints(
    tiny_corpus, tmp_path, monkeypatch
):
    """Without --val-every the N latest validations are the ends of the N latest epochs (fairseq's
    epoch checkpoints that Wu et al. average), and a run stopped by --max-steps inside an epoch keeps
    no mid-epoch one, recent or best: its last, partial epoch is not validated."""
    monkeypatch.chdir(tmp_path)
    args = tiny_train_args(tiny_corpus, tmp_path / "runs", "--keep-last", "10", "--keep-best", "1")
    at = args.index("--val-every")
    del args[at : at + 2]  # one validation an epoch
    assert train.main([*args, "--max-steps", "-1", "--max-epochs", "3", "--run-name", "a"]) == 0
    steps = recent_steps(tmp_path / "runs" / "a" / "version_0" / "checkpoints")
    epoch = steps[0]  # updates of one epoch
    assert epoch >= 2 and steps == [epoch, 2 * epoch, 3 * epoch]
    stop = 2 * epoch + epoch // 2  # halfway through the third epoch
    assert (
        train.main([*args, "--max-steps", str(stop), "--max-epochs", "100", "--run-name", "b"]) == 0
    )
    folder = tmp_path / "runs" / "b" / "version_0" / "checkpoints"
    assert recent_steps(folder) == [epoch, 2 * epoch]
    assert not (folder / f"best-{stop}.ckpt").exists()  # nor a best one with a stale BLEU
    last = torch.load(folder / "last.ckpt", map_location="cpu", weights_only=True)
    assert last["global_step"] == stop  # it did train into the third epoch


def test_patience_metric_reaches_the_run_and_its_hparams(tiny_corpus, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = tiny_train_args(tiny_corpus, tmp_path / "runs", "--patience", "1",
                           "--patience-metric", "loss", "--max-steps", "30",
                           "--val-every", "5")  # fmt: skip
    assert train.main(args) == 0
    folder = tmp_path / "runs" / "rnn-additive" / "version_0" / "checkpoints"
    last = torch.load(folder / "last.ckpt", map_location="cpu", weights_only=True)
    assert last["hyper_parameters"]["patience_metric"] == "loss"
    stops = [key for key in last["callbacks"] if key.startswith("EarlyStopping")]
    assert len(stops) == 1 and "val/loss" in stops[0]  # its state key names what it monitors
