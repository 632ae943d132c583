"""Running a study's runs: each an ordinary `train.py` child process with its share of the threads,
a scheduler's stop passed on to it (seq2seq.signals), every sitting logged with where it ran.
"""

import json
import os
import shlex
import shutil
import subprocess
import sys

from seq2seq.atomic import atomic_write_text
from seq2seq.machine import REPO, provenance
from seq2seq.signals import wait_forwarding
from seq2seq.study.layout import Study
from seq2seq.study.spec import Run, StudySpec

TRAIN = REPO / "scripts" / "train.py"


def train_command(study: Study, spec: StudySpec, run: Run) -> list[str]:
    """The train.py command of `run`: from scratch, or resuming its last.ckpt."""
    flags = spec.train_flags(run)
    command = [sys.executable, str(TRAIN), *flags]
    command += ["--log-dir", str(study.work_dir / "runs"), "--run-name", run.name]
    if not any(flag.split("=")[0] == "--cache-dir" for flag in flags):
        command += ["--cache-dir", str(study.work_dir / "cache")]  # one cache for all runs
    if study.last_checkpoint(run).is_file():
        command += ["--resume", str(study.last_checkpoint(run))]
    return command


def train(study: Study, spec: StudySpec, run: Run, threads: int) -> int:
    """Train `run` to its end (or resume it); returns train.py's exit status."""
    if study.state(run) == "new" and study.run_dir(run).exists():
        # Killed before its first checkpoint: nothing to resume, and a fresh start must land in
        # version_0 again, so the leftover folder goes.
        shutil.rmtree(study.run_dir(run))
    study.run_dir(run).mkdir(parents=True, exist_ok=True)
    command = train_command(study, spec, run)
    sitting = {"command": shlex.join(command[1:]), **provenance(), "threads": threads}
    with open(study.run_dir(run) / "sittings.jsonl", "a", encoding="utf-8") as log:
        log.write(json.dumps(sitting) + "\n")
    with open(study.run_dir(run) / "train.log", "ab") as log:
        log.write(f"\n$ {shlex.join(command)}\n".encode())
        log.flush()
        process = subprocess.Popen(
            command, cwd=REPO, env=thread_env(threads), stdout=log, stderr=subprocess.STDOUT
        )
        status = wait_forwarding(process)
    if status == 0:
        atomic_write_text(study.trained_marker(run), json.dumps(provenance()) + "\n")
    return status


def thread_env(threads: int) -> dict[str, str]:
    """The environment of a run limited to `threads` threads (torch, OpenMP and MKL all read these)."""
    env = dict(os.environ)
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[name] = str(threads)
    return env
