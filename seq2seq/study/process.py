"""Running a study's runs: each an ordinary `seq2seq train` child process with its share of the threads,
a scheduler's stop passed on to it (seq2seq.signals), every sitting logged with where it ran, and one
process at a time per run (a lock).

The lock (`<work>/locks/<run>.lock`, seq2seq.data.cachelock's: a POSIX record lock naming its holder)
is held by the `study.py one` process that trains and scores the run. A kill -9 of that process drops
the lock, and its children die with it (the kernel's parent-death signal: train.py, and scoring's
evaluate.py and average_checkpoints.py alike, all started by `start`), so a next start never finds a
half-owned run: it resumes from the last.ckpt, as after any kill. A stop that comes while a child is
being started waits (the stop signals are blocked) until the child is among those it is passed on to.
The lock's record is checked too (cachelock's `strict`): one that names a process of another node is
waited for even where this node could lock the file, as on NFS `nolock` or Lustre `localflock`, where
locks reach one node only; after a kill -9 on another node, docs/guides/clusters.md says what to do.
"""

import functools
import json
import os
import shlex
import shutil
import site
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from seq2seq.atomic import atomic_write_text
from seq2seq.data.cachelock import die_with_parent, exclusive, holder
from seq2seq.errors import STOPPED
from seq2seq.machine import provenance
from seq2seq.signals import STOPS, default_stops, held
from seq2seq.study.layout import Study
from seq2seq.study.spec import Run, StudySpec

# A child runs `python -m seq2seq ...` of this very package (package_env), in the caller's folder,
# where the spec's relative paths and a corpus found by name mean what they meant to the caller.
COMMAND = (sys.executable, "-m", "seq2seq")


@dataclass
class Budget:
    """A sitting's `--max-minutes` (None: no limit), counted from `started` (`time.monotonic()` when
    the sitting's process began): waiting for the run's lock, preparing the data, training and
    scoring all count against it."""

    minutes: float | None
    started: float = field(default_factory=time.monotonic)

    def left(self) -> float | None:
        """Minutes left (zero or less once spent); None without a limit."""
        if self.minutes is None:
            return None
        return self.minutes - (time.monotonic() - self.started) / 60

    def spent(self) -> bool:
        left = self.left()
        return left is not None and left <= 0


def train_command(
    study: Study, spec: StudySpec, run: Run, max_minutes: float | None = None
) -> list[str]:
    """The `seq2seq train` command of `run`: from scratch, or resuming its last.ckpt; `max_minutes`
    (what is left of the sitting's `Budget`) limits it (it stops with last.ckpt saved, status 4)."""
    flags = spec.train_flags(run)
    command = [*COMMAND, "train", *flags]
    command += ["--log-dir", str(study.work_dir / "runs"), "--run-name", run.name]
    if not any(flag.split("=")[0] == "--cache-dir" for flag in flags):
        command += ["--cache-dir", str(study.work_dir / "cache")]  # one cache for all runs
    if max_minutes is not None:
        command += ["--max-minutes", f"{max_minutes:.6g}"]
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
            message = (
                f"{run.name}: waiting for {holder(lock) or 'another process'}, which is training or "
                f"scoring it (lock {lock})"
            )
        print(message, file=sys.stderr, flush=True)

    # Strict: running unlocked would let two processes train one run. Without POSIX locks (NFS
    # without its lock daemon, Lustre without flock) a lock file whose holder is checked for life;
    # with locks that reach one node only, the holder's record checked after taking the lock.
    with exclusive(lock, log, strict=True):
        yield


def start(
    command: list[str], children: list[subprocess.Popen] | None = None, **kwargs: object
) -> subprocess.Popen:
    """A child that is killed when this process dies (Linux), so no run trains on unlocked; it is
    appended to `children` (the list a `forwarding` block passes stops on to) before any stop that
    came while it was being started is handled, so such a stop reaches it too. (The stop signals
    are blocked meanwhile; in a process of one thread, as study.py's are, that holds them back.)"""
    with held(STOPS):
        child = subprocess.Popen(
            command, preexec_fn=functools.partial(_starting, os.getpid()), **kwargs
        )
        if children is not None:
            children.append(child)
    return child


def _starting(parent: int) -> None:
    """The child's side of `start`, between fork and exec (the signal mask is inherited: unblock)."""
    die_with_parent(parent)
    default_stops()


def run_child(command: list[str], **kwargs: object) -> subprocess.CompletedProcess:
    """`subprocess.run(command, capture_output=True, text=True)` for a child started as `start`
    starts one (scoring's evaluate.py and average_checkpoints.py); an exception while it runs (a
    stop's) kills it before passing on."""
    with start(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
               **kwargs) as child:  # fmt: skip
        try:
            out, err = child.communicate()
        except BaseException:
            child.kill()
            raise
    return subprocess.CompletedProcess(command, child.returncode, out, err)


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
        process = start(
            command, children, env=thread_env(threads), stdout=log, stderr=subprocess.STDOUT
        )
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
