"""End-to-end runs of scripts/train.py on the tiny corpus, in-process."""

import re
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from seq2seq.commands import prepare, train
from seq2seq.errors import STOPPED
from seq2seq.models.attention import SCORERS
from tests.conftest import tiny_train_args


def scalars(run_dir: Path, tag: str) -> list[float]:
    events = EventAccumulator(str(run_dir))
    events.Reload()
    return [event.value for event in events.Scalars(tag)]


@pytest.mark.parametrize("score", SCORERS)
def test_train_writes_logs_and_checkpoints_and_loss_falls(
    score, tiny_corpus, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)  # the data cache goes to ./data/cache
    args = tiny_train_args(tiny_corpus, tmp_path / "runs", "--score", score, "--max-steps", "40")
    assert train.main(args + ["--lr", "3e-3", "--val-every", "20"]) == 0
    run = tmp_path / "runs" / f"rnn-{score}" / "version_0"
    assert (run / "hparams.yaml").read_text().count(f"score: {score}") == 1
    assert list(run.glob("events.out.tfevents.*"))
    assert (run / "checkpoints" / "last.ckpt").is_file()
    # --keep-best 5 (the default) keeps both validations' checkpoints, named by their steps.
    assert sorted(p.name for p in (run / "checkpoints").glob("best-*.ckpt")) == [
        "best-20.ckpt",
        "best-40.ckpt",
    ]
    losses = scalars(run, "train/loss")
    assert len(losses) >= 3 and losses[-1] < 0.95 * losses[0]
    for tag in ("val/bleu", "val/loss", "val/ppl", "val/attn_entropy", "lr", "train/grad_norm",
                "train/tokens_per_sec", "val/max_weight", "val/score_std"):  # fmt: skip
        assert scalars(run, tag), tag


def test_max_minutes_is_a_budget_per_process_and_a_resumed_run_trains_on(
    tiny_corpus, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    args = tiny_train_args(
        tiny_corpus, tmp_path / "runs", "--max-steps", "40", "--val-every", "1000"
    )
    last = tmp_path / "runs" / "rnn-additive" / "version_0" / "checkpoints" / "last.ckpt"

    def step() -> int:
        return torch.load(last, weights_only=True)["global_step"]

    # The cache first: building it counts against --max-minutes too, and would end a 60 ms budget
    # before any update on a slow or busy machine (tests/e2e/test_stops_prepare.py covers that stop).
    assert prepare.main(args) == 0
    # 60 ms of this process: it stops on an update boundary with last.ckpt saved, and says so.
    assert train.main(args + ["--max-minutes", "0.001"]) == STOPPED
    first = step()
    assert 1 <= first < 40
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == (f"stopped by --max-minutes 0.001: saved {last} at update "
                   f"{first}; continue with the same command and --resume "
                   f"{last}")  # fmt: skip
    # The same command resumed gets its own 60 ms (the checkpoint's elapsed time does not count).
    resume = ["--resume", str(last)]
    assert train.main(args + ["--max-minutes", "0.001", *resume]) == STOPPED
    assert first < step() < 40
    assert train.main(args + resume) == 0 and step() == 40


@pytest.mark.parametrize("native", [True, False], ids=["native bf16", "no native bf16"])
def test_precision_auto_trains_in_bf16_only_where_the_cpu_has_it(
    native, tiny_corpus, tmp_path, monkeypatch
):
    from seq2seq.training import launch

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(launch, "native_bf16", lambda: native)
    args = tiny_train_args(tiny_corpus, tmp_path / "runs", "--max-steps", "2")
    assert train.main(args) == 0  # --precision left at its default, auto
    hparams = (tmp_path / "runs" / "rnn-additive" / "version_0" / "hparams.yaml").read_text()
    # The run records what ran, not "auto": a resume or a reader sees the same precision.
    assert ("precision: bf16-mixed" in hparams) == native
    assert ("precision: 32-true" in hparams) == (not native)
    # A GPU keeps fp32 (bf16 unmeasured there); a name given is kept whatever the CPU.
    assert launch.resolve_precision("gpu", "auto") == "32-true"
    assert launch.resolve_precision("cpu", "32-true") == "32-true"
    assert launch.resolve_precision("cpu", "bf16-mixed") == "bf16-mixed"


def test_a_resumed_run_keeps_the_precision_auto_gave_it_on_any_cpu(
    tiny_corpus, tmp_path, monkeypatch, capsys
):
    from seq2seq.training import launch

    monkeypatch.chdir(tmp_path)
    last = tmp_path / "runs" / "rnn-additive" / "version_0" / "checkpoints" / "last.ckpt"

    def args(steps: int, *resume: str) -> list[str]:
        return tiny_train_args(tiny_corpus, tmp_path / "runs", "--max-steps", str(steps), *resume)

    monkeypatch.setattr(launch, "native_bf16", lambda: True)
    assert train.main(args(2)) == 0
    assert torch.load(last, weights_only=True)["precision"] == "bf16-mixed"

    # Resumed where bf16 is not native: still bf16-mixed, as it began, and the slow path is named.
    monkeypatch.setattr(launch, "native_bf16", lambda: False)
    capsys.readouterr()
    assert train.main(args(4, "--resume", str(last))) == 0
    assert "warning: --precision bf16-mixed: this CPU has no native bf16" in capsys.readouterr().err
    resumed = torch.load(last, weights_only=True)
    assert (resumed["global_step"], resumed["precision"]) == (4, "bf16-mixed")

    # A checkpoint from before `auto` trained in that day's default, fp32; it resumes so, even where
    # bf16 is native.
    monkeypatch.setattr(launch, "native_bf16", lambda: True)
    old = torch.load(last, weights_only=False)
    del old["precision"]
    torch.save(old, last)
    assert train.main(args(6, "--resume", str(last))) == 0
    resumed = torch.load(last, weights_only=True)
    assert (resumed["global_step"], resumed["precision"]) == (6, "32-true")


def test_a_run_says_its_plan_shows_the_whole_run_and_ends_naming_its_best_checkpoint(
    tiny_corpus, tmp_path, monkeypatch, capsys, caplog
):
    """Once 20 updates past the first 5 are timed, the run's updates, epochs and minutes; a bar of
    the run's updates, not the epoch's batches; at the end the best checkpoint, its BLEU and the
    command that scores it; and none of Lightning's lines a user cannot act on."""
    monkeypatch.chdir(tmp_path)
    args = tiny_train_args(tiny_corpus, tmp_path / "runs", "--max-steps", "60", "--val-every", "30")
    assert train.main(args) == 0
    out, err = capsys.readouterr()
    estimates = [line for line in out.splitlines() if line.startswith("Estimate")]
    assert len(estimates) == 2  # without validation priced, then with it
    assert "60 updates" in estimates[0] and "validation not included" in estimates[0]
    assert "1 more validation of" in estimates[1]
    assert re.search(r"Epoch 7/7: +100%.*\b60/60 \[", out)  # the run's 60, not an epoch's
    assert not re.search(r"\b\d+/9 \[", out)  # 9 batches an epoch
    folder = tmp_path / "runs" / "rnn-additive" / "version_0" / "checkpoints"
    best = folder / "best-30.ckpt" if "best-30" in out else folder / "best-60.ckpt"
    assert f"Best checkpoint: {best} (validation BLEU " in out
    assert f"python scripts/evaluate.py {best} --split test" in out.splitlines()[-1]
    assert "Model: RNNSeq2Seq, " in out
    printed = out + err + caplog.text
    for noise in ("TPU available", "FLOPs", "Fp32RecurrenceRNN", "LeafSpec", "v_num"):
        assert noise not in printed, noise


def test_best_checkpoints_hold_weights_and_what_scoring_reads_and_last_the_training_state(
    tiny_corpus, tmp_path, monkeypatch
):
    """Adam's moments (twice the weights) only in last.ckpt, which a resume reads; each best and
    recent checkpoint holds what loading, averaging and scoring read."""
    from seq2seq.checkpoint import read_checkpoint
    from seq2seq.decoding.averaging import average_checkpoints
    from seq2seq.decoding.loading import load_model
    from seq2seq.study.scoring import best_checkpoints

    monkeypatch.chdir(tmp_path)
    args = tiny_train_args(tiny_corpus, tmp_path / "runs", "--max-steps", "30", "--keep-last", "2")
    assert train.main(args) == 0
    folder = tmp_path / "runs" / "rnn-additive" / "version_0" / "checkpoints"
    last = torch.load(folder / "last.ckpt", weights_only=True)
    assert last["optimizer_states"] and last["callbacks"]
    kept = best_checkpoints(folder, last) + best_checkpoints(folder, last, monitor="step")
    assert sorted({p.name for p, _ in kept}) == sorted(
        p.name for p in folder.glob("*.ckpt") if p.name != "last.ckpt"
    )
    assert len(kept) == 5  # best-10, -20, -30 and recent-20, -30
    for path, _ in kept:
        checkpoint = read_checkpoint(path)
        assert "optimizer_states" not in checkpoint and "lr_schedulers" not in checkpoint
        assert checkpoint["tokenizer"] == last["tokenizer"]
        assert checkpoint["model_args"] == last["model_args"]
        assert checkpoint["hyper_parameters"]["corpus"] == last["hyper_parameters"]["corpus"]
        load_model(path)
    assert path.stat().st_size < (folder / "last.ckpt").stat().st_size
    average_checkpoints([p for p, _ in kept], tmp_path / "average.ckpt")
    load_model(tmp_path / "average.ckpt")
