"""--resume after kill -9, and the state a resume restores."""

import copy
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from seq2seq.commands import train
from seq2seq.training.config import parse_args
from seq2seq.training.system import TranslationSystem
from tests.conftest import tiny_train_args
from tests.unit.training.test_resume import load

TRAIN = ("-m", "seq2seq", "train")  # `python -m seq2seq train`
# Both kinds of dropout on: a resumed run goes on with the generator's draws and is compared bit for
# bit with one that was never stopped.
EXACT = ("--max-steps", "20", "--val-every", "10", "--dropout", "0.3", "--word-dropout", "0.1")


def assert_same_tensors(a: object, b: object) -> None:
    """Equal nested dicts/lists of tensors and plain values, tensors bit for bit."""
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            assert_same_tensors(a[key], b[key])
    elif isinstance(a, list | tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same_tensors(x, y)
    else:
        assert a == b


def test_run_killed_after_its_first_checkpoint_resumes_to_the_last_step(
    tiny_corpus: Path, tmp_path: Path
) -> None:
    flags = tiny_train_args(
        tiny_corpus,
        tmp_path / "runs",
        "--max-steps",
        "120",
        "--val-every",
        "20",
        "--keep-best",
        "1",
    )
    flags += ["--max-epochs", "1000"]  # 120 steps are 14 epochs of the tiny corpus
    command = [sys.executable, *TRAIN, *flags]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # two shared cores: threads only fight
    ckpts = tmp_path / "runs" / "rnn-additive" / "version_0" / "checkpoints"
    with open(tmp_path / "first.log", "w") as log:
        run = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=log, stderr=log)
        deadline = time.monotonic() + 180
        while not (ckpts / "last.ckpt").exists() and run.poll() is None:
            assert time.monotonic() < deadline, "no checkpoint within 180 s"
            time.sleep(0.05)
        run.send_signal(signal.SIGKILL)
        assert run.wait() == -signal.SIGKILL, "finished before it could be killed"
    killed_at = load(ckpts / "last.ckpt")["global_step"]
    assert 20 <= killed_at < 120
    resumed = subprocess.run(
        [*command, "--resume"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"at step {killed_at}" in resumed.stdout
    assert load(ckpts / "last.ckpt")["global_step"] == 120
    run_dir = ckpts.parent
    assert [p.name for p in run_dir.parent.iterdir()] == ["version_0"]  # no version_1
    assert len(list(run_dir.glob("events.out.tfevents.*"))) == 2  # both runs log here
    assert len(list(ckpts.glob("best-*.ckpt"))) == 1  # best tracking carried on
    assert not list(ckpts.glob(".*"))  # no temporary file left


STEP_10 = "interrupted-step-10.ckpt"  # beside the runs: the crashed run's last.ckpt as it crashed


@pytest.fixture(scope="module")
def interrupted(tiny_corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding an uninterrupted 20-step run ("straight") and one that crashed after the
    checkpoint of step 10 ("interrupted"), whose last.ckpt then is also kept as `STEP_10`; both
    with the same flags."""
    root = tmp_path_factory.mktemp("resume")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)
        assert train.main(tiny_train_args(tiny_corpus, root / "straight", *EXACT)) == 0

        def crash(self: TranslationSystem, batch: dict, batch_idx: int) -> None:
            if self.trainer.global_step == 10:  # just after the step-10 checkpoint
                raise KeyError("simulated crash")

        patch.setattr(TranslationSystem, "on_train_batch_start", crash)
        with pytest.raises(KeyError, match="simulated crash"):
            train.main(tiny_train_args(tiny_corpus, root / "interrupted", *EXACT))
    shutil.copyfile(ckpt_dir(root, "interrupted") / "last.ckpt", root / STEP_10)
    return root


def ckpt_dir(root: Path, run: str) -> Path:
    return root / run / "rnn-additive" / "version_0" / "checkpoints"


def test_resume_restores_the_saved_state_and_matches_an_uninterrupted_run(
    interrupted: Path, tiny_corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(interrupted)
    saved = load(ckpt_dir(interrupted, "interrupted") / "last.ckpt")
    assert saved["global_step"] == 10
    restored: dict = {}

    def capture(self: TranslationSystem) -> None:  # after Lightning restored, before step 11
        restored["step"] = self.trainer.global_step
        restored["weights"] = {k: v.clone() for k, v in self.state_dict().items()}
        optimizer, scheduler = self.trainer.optimizers[0], self.trainer.lr_scheduler_configs[0]
        restored["optimizer"] = copy.deepcopy(optimizer.state_dict())  # Adam updates in place
        restored["scheduler"] = copy.deepcopy(scheduler.scheduler.state_dict())

    monkeypatch.setattr(TranslationSystem, "on_train_start", capture)
    args = tiny_train_args(tiny_corpus, interrupted / "interrupted", *EXACT, "--resume")
    assert train.main(args) == 0
    assert restored["step"] == 10
    assert_same_tensors(restored["weights"], saved["state_dict"])
    assert_same_tensors(restored["optimizer"], saved["optimizer_states"][0])
    assert restored["scheduler"]["last_epoch"] == saved["lr_schedulers"][0]["last_epoch"] == 10
    # Same weights, optimizer moments and schedule at step 20 as the run that never stopped:
    # nothing was lost or replayed, including the order of the batches after the resume.
    resumed = load(ckpt_dir(interrupted, "interrupted") / "last.ckpt")
    straight = load(ckpt_dir(interrupted, "straight") / "last.ckpt")
    assert resumed["global_step"] == straight["global_step"] == 20
    assert_same_tensors(resumed["state_dict"], straight["state_dict"])
    assert_same_tensors(resumed["optimizer_states"], straight["optimizer_states"])


@pytest.mark.parametrize(
    "change, expected",
    [
        (("--hidden-size", "64"), "trained with --hidden-size 32 (now 64); resume with the flags"),
        # Weights of the same names and shapes: only the checkpoint's own settings tell them apart.
        (("--no-tie-embeddings",), "trained with --tie-embeddings True (now False); resume with"),
        (("--decoder", "cgru"), "trained with --decoder bahdanau (now cgru)"),
        (("--model", "transformer"), "trained with --model rnn (now transformer); resume with"),
        (("--vocab-size", "90"), "trained with another tokenizer; resume with the same corpus"),
        (
            ("--batch-tokens", "500", "--seed", "2"),
            "trained with --batch-tokens 400, --seed 1 (now 500, 2); resume with the same settings",
        ),
        (("--accumulate-grad-batches", "2"), "trained with --accumulate-grad-batches 1 (now 2)"),
        # The rows read move with it.
        (("--limit-train-pairs", "150"), "trained with --limit-train-pairs None (now 150)"),
    ],
)
def test_resume_refuses_a_checkpoint_of_another_model(
    interrupted: Path, tiny_corpus: Path, monkeypatch: pytest.MonkeyPatch, capsys, change, expected
) -> None:
    monkeypatch.chdir(interrupted)
    ckpt = ckpt_dir(interrupted, "straight") / "last.ckpt"
    args = tiny_train_args(
        tiny_corpus, interrupted / "other", *EXACT, *change, "--resume", str(ckpt)
    )
    before = sorted(p.name for p in ckpt.parent.iterdir())
    assert train.main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"error: {ckpt}: ") and expected in err
    assert sorted(p.name for p in ckpt.parent.iterdir()) == before  # nothing written there


def test_resume_refuses_a_weights_only_checkpoint(
    interrupted: Path, tiny_corpus: Path, tmp_path: Path, capsys
) -> None:
    """A best-<step>.ckpt holds the weights alone (scoring and averaging read it); last.ckpt, which
    a resume reads, holds the training state too."""
    folder = ckpt_dir(interrupted, "straight")
    best = sorted(folder.glob("best-*.ckpt"))[-1]
    assert "optimizer_states" in load(folder / "last.ckpt")
    args = tiny_train_args(tiny_corpus, tmp_path / "runs", "--resume", str(best))
    assert train.main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"error: {best}: holds weights only, no training state to resume (resume from the run's "
        "last.ckpt)"
    )


def test_a_new_max_steps_moves_the_end_and_keeps_the_schedule(
    interrupted: Path, tiny_corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    def rates(run: Path) -> dict[int, float]:
        events = EventAccumulator(str(run.parent))
        events.Reload()
        return {e.step: e.value for e in events.Scalars("lr")}

    monkeypatch.chdir(interrupted)
    copy_of = shutil.copytree(interrupted / "interrupted", tmp_path / "interrupted")
    # The crashed run's step-10 state (another test may have resumed the run past it since).
    ckpt = copy_of / "rnn-additive" / "version_0" / "checkpoints" / "last.ckpt"
    shutil.copyfile(interrupted / STEP_10, ckpt)
    flags = tiny_train_args(tiny_corpus, tmp_path / "runs", *EXACT)
    assert train.main([*flags, "--max-steps", "30", "--resume", str(ckpt)]) == 0
    assert load(ckpt.with_name("last.ckpt"))["global_step"] == 30
    resumed = rates(ckpt.parent)
    straight = rates(ckpt_dir(interrupted, "straight"))
    # Up to the first horizon (20 updates) the rate is the never-stopped run's, not a new cosine
    # over 30; after it, the floor: lr x min_lr_ratio.
    common = [step for step in straight if 10 < step <= 20 and step in resumed]
    assert common and all(resumed[s] == pytest.approx(straight[s]) for s in common)
    cfg = parse_args(flags)
    floor = cfg.lr * cfg.min_lr_ratio
    assert all(v == pytest.approx(floor) for s, v in resumed.items() if s > 21)


def test_resume_refuses_other_training_pairs(
    interrupted: Path, tiny_corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    # The same corpus folder, one training sentence edited: the same flags would read other pairs.
    edited = shutil.copytree(tiny_corpus, tmp_path / "tiny")
    lines = (edited / "train.en").read_text().splitlines()
    lines[5] = lines[5].upper()
    (edited / "train.en").write_text("\n".join(lines) + "\n")
    monkeypatch.chdir(interrupted)
    ckpt = ckpt_dir(interrupted, "straight") / "last.ckpt"
    args = tiny_train_args(edited, tmp_path / "runs", *EXACT, "--resume", str(ckpt))
    assert train.main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"error: {ckpt}: trained on other training pairs (SHA-1 ")
    assert err.endswith("; resume on the corpus it trained on")
