"""Where a resume continues, what it must keep, and checkpoints that survive a torn write (--resume after kill -9 and
the state a resume restores: tests/e2e/test_resume.py)."""

import dataclasses
import shutil
from pathlib import Path

import pytest
import torch

import seq2seq.checkpoint as checkpoint_io
import seq2seq.training.runs as runs
from seq2seq.checkpoint import atomic_save
from seq2seq.cli import cli_message, part
from seq2seq.data.datamodule import TranslationDataModule, order_settings
from seq2seq.errors import UserError
from seq2seq.recipes import CLASSIC_RNN, RNN_0_3
from seq2seq.training.config import OptimConfig, TrainConfig
from seq2seq.training.runs import remove_stale_temporaries


def load(path: Path) -> dict:
    return torch.load(path, weights_only=True)


def test_resume_path_inside_a_run_continues_that_version_folder(tmp_path: Path) -> None:
    ckpt = tmp_path / "runs" / "rnn-dot" / "version_3" / "checkpoints" / "best-40.ckpt"
    ckpt.parent.mkdir(parents=True)
    ckpt.write_bytes(b"")
    folder, path = runs.resume_plan("elsewhere", "rnn-additive", str(ckpt))
    assert (folder.save_dir, folder.name, folder.version, path) == (
        str(tmp_path / "runs"), "rnn-dot", 3, ckpt
    )  # fmt: skip
    (tmp_path / "runs" / "rnn-dot" / "version_10" / "checkpoints").mkdir(parents=True)
    (tmp_path / "runs" / "rnn-dot" / "version_10" / "checkpoints" / "last.ckpt").write_bytes(b"")
    (tmp_path / "runs" / "rnn-dot" / "version_11").mkdir()  # started, no checkpoint yet
    folder, path = runs.resume_plan(str(tmp_path / "runs"), "rnn-dot", "latest")
    assert folder.version == 10 and path.parent.parent.name == "version_10"
    shutil.copy(ckpt, tmp_path / "loose.ckpt")
    folder, _ = runs.resume_plan("runs", "rnn-dot", str(tmp_path / "loose.ckpt"))
    assert folder.version is None and folder.save_dir == "runs"  # a new version of this run


def test_atomic_save_survives_a_crash_mid_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "last.ckpt"
    atomic_save({"step": torch.tensor(1)}, path)
    real_save = torch.save

    def torn_save(obj: object, file) -> None:
        real_save({"step": torch.tensor(2), "big": torch.zeros(10_000)}, file)
        file.truncate(100)  # half a file reached the disk, then the process died
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint_io.torch, "save", torn_save)
    with pytest.raises(OSError):
        atomic_save({"step": torch.tensor(2)}, path)
    assert load(path)["step"] == 1  # the previous checkpoint, intact
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]  # no temporary file left


def test_temporaries_of_a_killed_save_are_removed(tmp_path: Path) -> None:
    (tmp_path / "last.ckpt").write_bytes(b"good")
    (tmp_path / ".last.ckpt.k2j3h4.tmp").write_bytes(b"torn")  # what kill -9 mid-save leaves
    assert remove_stale_temporaries(tmp_path) == [tmp_path / ".last.ckpt.k2j3h4.tmp"]
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]


def saved_run(cfg: TrainConfig) -> dict:
    """What a checkpoint of a run with `cfg` holds of its settings: the optimisation's and
    validation's in hyper_parameters, the model's in model_args, the batch order in the data
    module's state."""
    return {
        "hyper_parameters": {**dataclasses.asdict(part(cfg, OptimConfig)), "corpus": None},
        "model_args": {
            "kind": cfg.model,
            "dropout": cfg.dropout,
            "emb_size": cfg.emb_size,
            "vocab_size": 100,
        },  # fmt: skip
        TranslationDataModule.__qualname__: {"order": order_settings(cfg, 1)},
    }


def test_a_resume_keeps_the_recipe_it_trained_with(tmp_path: Path) -> None:
    """A run of the recipe before 0.3.0, resumed with no recipe flags, is refused with every flag
    it needs; given them, or more epochs, it resumes. A run of 0.3.0's needs `--emb-size 256`."""
    old = TrainConfig(**CLASSIC_RNN)
    checkpoint, path = saved_run(old), tmp_path / "last.ckpt"
    with pytest.raises(UserError) as refused:
        runs.check_same_recipe(TrainConfig(), 1, checkpoint, path)
    message = cli_message(refused.value)
    assert message.startswith(
        f"{path}: trained with --batch-tokens 2048, --emb-size 256, --dropout 0.3, --lr 0.001, "
        "--word-dropout 0.0 (now 4096, 512, 0.5, 0.002, 0.1); resume with the same settings"
    )
    with pytest.raises(UserError, match=r"trained with `emb_size` 256 \(now 512\);"):
        runs.check_same_recipe(TrainConfig(), 1, saved_run(TrainConfig(**RNN_0_3)), path)
    runs.check_same_recipe(TrainConfig(**RNN_0_3), 1, saved_run(TrainConfig(**RNN_0_3)), path)
    runs.check_same_recipe(old, 1, checkpoint, path)
    runs.check_same_recipe(dataclasses.replace(old, max_epochs=40), 1, checkpoint, path)
    # One setting alone is named alone; the batch order's own check still speaks for its flags.
    with pytest.raises(UserError, match=r"trained with `lr` 0.001 \(now 0.0005\)"):
        runs.check_same_recipe(dataclasses.replace(old, lr=5e-4), 1, checkpoint, path)
    with pytest.raises(UserError, match=r"`seed` 1 \(now 2\); .* order of training batches"):
        runs.check_same_recipe(dataclasses.replace(old, seed=2), 1, checkpoint, path)


def test_a_checkpoint_keeps_the_gpus_generator_and_a_resume_restores_it(monkeypatch) -> None:
    """On a GPU dropout draws from the device's generator: saved beside the CPU's and set again on
    resume, else a resumed run replays its first masks. Faked here: the machine has no GPU."""
    from types import SimpleNamespace

    from seq2seq.models.build import build_model
    from seq2seq.training.system import TranslationSystem

    model = build_model({"model": "rnn", "vocab_size": 30, "emb_size": 8, "hidden_size": 8})
    tokenizer = SimpleNamespace(to_bytes=lambda: b"spm")  # all a save asks of it
    system = TranslationSystem(model, tokenizer)  # type: ignore[arg-type]
    monkeypatch.setattr(TranslationSystem, "trainer", SimpleNamespace(precision="32-true"))
    state, restored = torch.arange(16, dtype=torch.uint8), []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda *device: state.clone())
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda new, *device: restored.append(new))
    checkpoint: dict = {}
    system.on_save_checkpoint(checkpoint)
    torch.testing.assert_close(checkpoint["cuda_rng_state"], state)
    system.on_load_checkpoint(checkpoint)
    assert len(restored) == 1 and torch.equal(restored[0], state)
    # A checkpoint from before (no GPU state) still loads, and sets no GPU generator.
    del checkpoint["cuda_rng_state"]
    system.on_load_checkpoint(checkpoint)
    assert len(restored) == 1
