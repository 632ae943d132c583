"""A polite stop during validation: train.py given a real SIGTERM while it validates, or whose
--max-minutes run out then, ends the pass at the next batch, saves last.ckpt of the last update (the
pass counted as not begun) and exits 4 within seconds; the resumed run validates that update again,
whole, and ends at the planned update. A stop leaves stopped.json beside last.ckpt for a requeue
script; the finished resume removes it."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from seq2seq.errors import STOPPED
from tests.conftest import ROOT, tiny_train_args, write_corpus

TRAIN = ("-m", "seq2seq", "train")  # `python -m seq2seq train`
# Validation after update 5 only; the run ends at update 8 (no validation there).
FLAGS = ("--max-steps", "8", "--val-every", "5", "--max-epochs", "1000", "--val-beam", "2")
# The first run's validation made slow (a second a batch, ~26 batches) and announced by a file, so
# the signal lands in its first batches and a stop honoured only after the pass would take 25 s.
SLOW_VALIDATION = (
    "import os, pathlib, sys, time\n"
    "import seq2seq.training.system as system\n"
    "real = system.TranslationSystem.validation_step\n"
    "def validation_step(self, batch, batch_idx):\n"
    "    pathlib.Path(os.environ['VALIDATING']).touch()\n"
    "    if os.environ.get('BUDGET_SPENT') and batch_idx == 0:  # --max-minutes run out: now\n"
    "        for callback in self.trainer.callbacks:\n"
    "            if type(callback).__name__ == 'PoliteStop':\n"
    "                callback.started -= callback.budget\n"
    "    time.sleep(1.0)\n"
    "    return real(self, batch, batch_idx)\n"
    "system.TranslationSystem.validation_step = validation_step\n"
    "from seq2seq.commands.train import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


def _env(**extra: str) -> dict[str, str]:
    root = str(ROOT)
    return {**os.environ, "PYTHONPATH": root, "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
            **extra}  # fmt: skip


@pytest.mark.parametrize("stop", ["SIGTERM", "--max-minutes"])
def test_a_stop_during_validation_exits_4_within_seconds_and_the_resume_validates_again(
    tmp_path: Path, stop: str
) -> None:
    corpus = write_corpus(tmp_path / "corpus", {"train": 200, "val": 600, "test": 20})
    args = tiny_train_args(corpus, tmp_path / "runs", *FLAGS)
    budget = ["--max-minutes", "60"] if stop == "--max-minutes" else []
    extra = {"BUDGET_SPENT": "1"} if budget else {}
    checkpoints = tmp_path / "runs" / "rnn-additive" / "version_0" / "checkpoints"
    validating, log = tmp_path / "validating", tmp_path / "train.log"
    with open(log, "w") as out:
        run = subprocess.Popen([sys.executable, "-c", SLOW_VALIDATION, *args, *budget],
                               cwd=tmp_path, env=_env(VALIDATING=str(validating), **extra), stdout=out,
                               stderr=subprocess.STDOUT)  # fmt: skip
        try:
            deadline = time.monotonic() + 180
            while not validating.exists():
                assert run.poll() is None, log.read_text()[-2000:]
                assert time.monotonic() < deadline, "validation never started"
                time.sleep(0.05)
            if not budget:
                run.send_signal(signal.SIGTERM)
            sent = time.monotonic()  # with --max-minutes: spent at the pass's first batch, by now
            status = run.wait(60)
            took = time.monotonic() - sent
        finally:
            if run.poll() is None:
                run.kill()
    assert status == STOPPED, log.read_text()[-2000:]
    assert took < 10, f"the stop took {took:.1f} s"
    last = checkpoints / "last.ckpt"
    # The last line as a terminal shows it: after the validation bar erased itself (\r, cursor up).
    shown = re.split(r"\r|\x1b\[A", log.read_text().strip().splitlines()[-1])[-1].strip()
    reason = "stopped by --max-minutes 60" if budget else "stopped by SIGTERM"
    assert shown == (
        f"{reason}: saved {last} at update 5; continue with the same command and --resume {last}"
    )
    assert torch.load(last, weights_only=False)["global_step"] == 5
    assert not list(checkpoints.glob("best-*.ckpt"))  # no BLEU of part of the split was kept
    marker = json.loads((checkpoints / "stopped.json").read_text())
    assert marker == {"reason": reason, "step": 5, "checkpoint": str(last)}

    resumed = subprocess.run([sys.executable, *TRAIN, *args, "--resume", str(last)],
                             cwd=tmp_path, env=_env(), capture_output=True, text=True,
                             timeout=300)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert torch.load(last, weights_only=False)["global_step"] == 8
    # The validation after update 5 ran again, whole: its BLEU made the best checkpoint.
    assert [p.name for p in checkpoints.glob("best-*.ckpt")] == ["best-5.ckpt"]
    assert not (checkpoints / "stopped.json").exists()  # finished: nothing to requeue
