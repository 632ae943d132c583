"""Two CPU processes under DDP: training works, validation BLEU covers every sentence exactly once."""

import os
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from seq2seq.data import TranslationDataModule
from seq2seq.system import load_system
from tests.conftest import tiny_train_args

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "train.py"
# A wider model at a high rate reaches a BLEU above zero within 40 steps: equal BLEU means something.
LEARNS = ("--emb-size", "32", "--hidden-size", "64", "--lr", "1e-2", "--dropout", "0")


def scalars(run_dir: Path, tag: str) -> list[float]:
    events = EventAccumulator(str(run_dir))
    events.Reload()
    return [event.value for event in events.Scalars(tag)]


@pytest.mark.slow
def test_two_process_ddp_trains_and_its_bleu_equals_one_process_bleu(
    tiny_corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    flags = tiny_train_args(tiny_corpus, tmp_path / "runs", *LEARNS, "--label-smoothing", "0")
    flags += ["--devices", "2", "--strategy", "ddp", "--max-steps", "40", "--val-every", "10",
              "--keep-best", "1"]  # fmt: skip
    flags += ["--max-epochs", "1000"]  # --max-steps decides
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # two processes on two shared cores
    run = subprocess.run(
        [sys.executable, str(SCRIPT), *flags],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "All distributed processes registered. Starting with 2 processes" in run.stderr
    assert run.stdout.count("Logging to") == 1  # rank 0 alone prints, logs and checkpoints
    run_dir = tmp_path / "runs" / "rnn-additive" / "version_0"
    assert [p.name for p in run_dir.parent.iterdir()] == ["version_0"]
    assert len(list(run_dir.glob("events.out.tfevents.*"))) == 1
    # best-<step>.ckpt holds the weights of the validation with the highest BLEU.
    bleus, losses = scalars(run_dir, "val/bleu"), scalars(run_dir, "val/loss")
    assert len(bleus) == len(losses) == 4
    best = max(range(4), key=lambda i: (bleus[i], -i))
    ddp_bleu, ddp_loss = bleus[best], losses[best]
    assert [p.name for p in run_dir.glob("checkpoints/best-*")] == [f"best-{10 * (best + 1)}.ckpt"]

    # The same checkpoint validated by one process: every sentence on one rank, no gathering.
    monkeypatch.chdir(tmp_path)  # the data cache that the run wrote
    system = load_system(next(run_dir.glob("checkpoints/best-*.ckpt")))
    cfg = system.cfg
    dm = TranslationDataModule(
        data_dir=cfg.data_dir,
        src_lang=cfg.src,
        tgt_lang=cfg.tgt,
        vocab_size=cfg.vocab_size,
        batch_tokens=cfg.batch_tokens,
        max_len=cfg.max_len,
    )
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    single = trainer.validate(system, datamodule=dm, verbose=False)[0]
    assert ddp_bleu > 0  # else equality would prove little
    assert single["val/bleu"] == pytest.approx(ddp_bleu, abs=1e-4)  # events store float32
    assert single["val/loss"] == pytest.approx(ddp_loss, rel=1e-4)  # each sentence counted once
