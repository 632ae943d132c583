"""A polite stop during data preparation, with real signals on train.py: SIGTERM while the training
split is encoded, or while waiting for another process's cache lock, exits 4 within seconds, leaves
no temporary and no half-written split, and the next start prepares the cache and trains."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from seq2seq.data.cachelock import exclusive
from seq2seq.errors import STOPPED
from tests.conftest import ROOT, tiny_train_args, write_corpus

TRAIN = ("-m", "seq2seq", "train")  # `python -m seq2seq train`
REPEATS = 2500  # 500,000 training pairs: encoding them in one process takes 15 s or more here
FLAGS = ("--max-steps", "1", "--spm-sample", "2000", "--prepare-workers", "1")


def _env() -> dict[str, str]:
    root = str(ROOT)
    return {**os.environ, "PYTHONPATH": root, "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def _stop_when(run: subprocess.Popen, log: Path, line: str) -> tuple[int, float]:
    """SIGTERM `run` once `log` holds `line`; its exit status and the seconds it took to exit."""
    try:
        deadline = time.monotonic() + 180
        while line not in log.read_text():
            assert run.poll() is None, log.read_text()[-2000:]
            assert time.monotonic() < deadline, f"never printed {line!r}"
            time.sleep(0.05)
        run.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        status = run.wait(60)
        return status, time.monotonic() - sent
    finally:
        if run.poll() is None:
            run.kill()


def _start(args: list[str], cwd: Path, log: Path) -> subprocess.Popen:
    with open(log, "w") as out:
        return subprocess.Popen([sys.executable, *TRAIN, *args], cwd=cwd, env=_env(),
                                stdout=out, stderr=subprocess.STDOUT)  # fmt: skip


def test_sigterm_while_encoding_or_waiting_for_the_lock_exits_4_and_blocks_nothing(
    tmp_path: Path,
) -> None:
    corpus = write_corpus(tmp_path / "corpus")
    for lang in ("de", "en"):  # a big training split, written at once
        path = corpus / f"train.{lang}"
        path.write_text(path.read_text("utf-8") * REPEATS, "utf-8")
    args = tiny_train_args(corpus, tmp_path / "runs", *FLAGS)
    cache = tmp_path / "data" / "cache"
    stopped = "stopped by SIGTERM before training began; nothing new to save"

    # 1. Encoding the training split (the tokenizer is ready, the lock held).
    log = tmp_path / "encoding.log"
    status, took = _stop_when(_start(args, tmp_path, log), log, "prepare: tokenizer ready")
    assert status == STOPPED, log.read_text()[-2000:]
    assert took < 10, f"the stop took {took:.1f} s"
    assert log.read_text().strip().splitlines()[-1] == stopped
    assert not list(cache.rglob(".*.tmp"))  # the split's temporary folder is gone with its owner
    assert not list((cache / "encoded").glob("*-train-*"))  # and no half split was published
    assert not list((tmp_path / "runs").rglob("*.ckpt"))

    # 2. Waiting for the lock, held here by this process, as another rank's builder would.
    (lock,) = cache.glob("*.lock")
    log = tmp_path / "waiting.log"
    with exclusive(lock, print):
        waiting = f"waiting for pid {os.getpid()}"
        status, took = _stop_when(_start(args, tmp_path, log), log, waiting)
    assert status == STOPPED, log.read_text()[-2000:]
    assert took < 10, f"the stop took {took:.1f} s"
    assert log.read_text().strip().splitlines()[-1] == stopped

    # 3. Nothing left blocks the next start: it prepares the cache and trains.
    args += ["--prepare-workers", "2"]  # the split path does not depend on it: quicker here
    done = subprocess.run([sys.executable, *TRAIN, *args], cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert len(list((cache / "encoded").glob("*-train-*"))) == 1
    assert not list(cache.rglob(".*.tmp"))
