"""Running a study's runs: each an ordinary `seq2seq train` child process with its share of the threads,
a scheduler's stop passed on to it (seq2seq.signals), every sitting logged with where it ran, and one
process at a time per run (a lock).

The lock (`<work>/locks/<run>.lock`, seq2seq.data.cachelock's: a POSIX record lock naming its holder)
is held by the `study.py one` process that trains and scores the run. A kill -9 of that process drops
the lock, and its train.py dies with it (the kernel's parent-death signal), so a next start never
finds a half-owned run: it resumes from the last.ckpt, as after any kill.
"""

import functools
import json
import os
import shlex
import shutil
import site
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from seq2seq.atomic import atomic_write_text
from seq2seq.data.cachelock import Owner, die_with_parent, exclusive
from seq2seq.errors import STOPPED
from seq2seq.machine import provenance
from seq2seq.signals import STOPS
from seq2seq.study.layout import Study
from seq2seq.study.spec import Run, StudySpec

# A child runs `python -m seq2seq ...` of this very package (package_env), in the caller's folder,
# where the spec's relative paths and a corpus found by name mean what they meant to the caller.
COMMAND = (sys.executable, "-m", "seq2seq")


def train_command(
    study: Study, spec: StudySpec, run: Run, max_minutes: float | None = None
) -> list[str]:
    """The `seq2seq train` command of `run`: from scratch, or resuming its last.ckpt; `max_minutes` limits
    the sitting (train.py stops on an update boundary with last.ckpt saved, status 4)."""
    flags = spec.train_flags(run)
    command = [*COMMAND, "train", *flags]
    command += ["--log-dir", str(study.work_dir / "runs"), "--run-name", run.name]
    if not any(flag.split("=")[0] == "--cache-dir" for flag in flags):
        command += ["--cache-dir", str(study.work_dir / "cache")]  # one cache for all runs
    if max_minutes is not None:
        command += ["--max-minutes", str(max_minutes)]
    if study.last_checkpoint(run).is_file():
        command += ["--resume", str(study.last_checkpoint(run))]
    return command


@contextmanager
def run_lock(study: Study, run: Run) -> Iterator[None]:
    """Hold `run`'s lock for the block: a second process for the same run (`study.py run` beside
    `study.py one`, a requeued array task overlapping its predecessor) waits, saying once whom for,
    and then finds the run as the first left it."""
    lock = study.lock_path(run)

    def log(message: str) -> None:
        if message.startswith("waiting for"):
            try:
                holder = Owner.from_tag(lock.read_text().strip())
            except OSError:
                holder = None
            message = (
                f"{run.name}: waiting for {holder or 'another process'}, which is training or "
                f"scoring it (lock {lock})"
            )
        print(message, file=sys.stderr, flush=True)

    with exclusive(lock, log):
        yield


def start(command: list[str], **kwargs: object) -> subprocess.Popen:
    """A child that is killed when this process dies (Linux), so no run trains on unlocked."""
    preexec = functools.partial(die_with_parent, os.getpid())
    return subprocess.Popen(command, preexec_fn=preexec, **kwargs)


def train(
    study: Study,
    spec: StudySpec,
    run: Run,
    threads: int,
    children: list[subprocess.Popen],
    max_minutes: float | None = None,
) -> int:
    """Train `run` to its end (or resume it); returns train.py's exit status (`exit_status`'s).
    The child is appended to `children`, for the caller to pass a stop on to."""
    if study.state(run) == "new" and study.run_dir(run).exists():
        # Killed before its first checkpoint: nothing to resume, and a fresh start must land in
        # version_0 again, so the leftover folder goes.
        shutil.rmtree(study.run_dir(run))
    study.run_dir(run).mkdir(parents=True, exist_ok=True)
    command = train_command(study, spec, run, max_minutes)
    sitting = {"command": shlex.join(command[1:]), **provenance(), "threads": threads}
    with open(study.run_dir(run) / "sittings.jsonl", "a", encoding="utf-8") as log:
        log.write(json.dumps(sitting) + "\n")
    with open(study.run_dir(run) / "train.log", "ab") as log:
        log.write(f"\n$ {shlex.join(command)}\n".encode())
        log.flush()
        process = start(command, env=thread_env(threads), stdout=log, stderr=subprocess.STDOUT)
        children.append(process)
        status = exit_status(process.wait())
    if status == 0:
        atomic_write_text(study.trained_marker(run), json.dumps(provenance()) + "\n")
    return status


def exit_status(status: int) -> int:
    """A child's status as this process exits with it: a child ended by a scheduler's stop signal
    (before it could stop politely) is a stop, STOPPED; by another signal, 128 + its number, as a
    shell says (Popen's negative status would leave sys.exit as 256 minus it)."""
    if status < 0:
        return STOPPED if -status in STOPS else 128 - status
    return status


def thread_env(threads: int) -> dict[str, str]:
    """The environment of a run limited to `threads` threads (torch, OpenMP and MKL all read these)."""
    env = package_env()
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[name] = str(threads)
    return env


def package_env() -> dict[str, str]:
    """This process's environment, with the folder holding this `seq2seq` package (a checkout, or
    a PYTHONPATH entry) first on PYTHONPATH: a `python -m seq2seq` child runs the same code. An
    installed package needs nothing: the child's interpreter finds it where this one did."""
    env = dict(os.environ)
    home = str(Path(__file__).resolve().parents[2])
    path = [entry for entry in env.get("PYTHONPATH", "").split(os.pathsep) if entry]
    if home not in {*site.getsitepackages(), site.getusersitepackages()} and path[:1] != [home]:
        env["PYTHONPATH"] = os.pathsep.join([home, *path])
    return env
