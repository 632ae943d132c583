"""Faults as they happen: a preparation killed with SIGKILL (the builder alone, or its whole process
group) at seeded random moments of each phase, then a real restart that must finish within a bound
and leave the same cache that a preparation without faults builds."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import ROOT, write_corpus

RESTART_SECONDS = 60  # a restart that takes longer than this has hung
# Large enough that each phase lasts a good fraction of a second on a busy 2-core machine.
SIZES = {"train": 200_000, "val": 20_000, "test": 20_000}


def _prepare_args(corpus: Path, cache: Path) -> list[str]:
    return [
        sys.executable, "-m", "seq2seq", "prepare", "--data-dir", str(corpus),
        "--cache-dir", str(cache), "--vocab-size", "100", "--spm-sample", "100000",
        "--prepare-workers", "2",
    ]  # fmt: skip


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "HF_DATASETS_OFFLINE": "1"}


def _contents(cache: Path) -> dict[str, bytes]:
    """Every file of a cache by relative path; timings in meta.json left out, temporaries kept (so a
    leftover one shows up as a difference)."""
    files = {}
    for path in sorted(cache.rglob("*")):
        if path.is_file() and not path.name.endswith(".lock"):
            data = path.read_bytes()
            if path.name == "meta.json":
                data = data.split(b', "seconds"')[0]
            files[str(path.relative_to(cache))] = data
    return files


@pytest.fixture(scope="module")
def corpus_and_clean_cache(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("faults")
    corpus = write_corpus(root / "corpus", SIZES, seed=7)
    run = subprocess.run(
        _prepare_args(corpus, root / "clean"), env=_env(), capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    return corpus, _contents(root / "clean")


def _wait_for(what: str, started: subprocess.Popen, log: Path, cache: Path) -> None:
    """Return once the preparation has reached phase `what`."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert started.poll() is None, f"finished before {what}: {log.read_text()}"
        if what == "tokenizer" and "training sentencepiece" in log.read_text():
            return
        if what == "encoding" and any((cache / "encoded").glob(".*-train-*")):
            return
        if what == "renames" and _stopped(started.pid):  # paused at the rename (AT_RENAME)
            return
        time.sleep(0.005)
    raise AssertionError(f"never reached {what}")


# The builder stops itself (SIGSTOP) right before it renames the whole training split into place, so
# that the test's SIGKILL lands at the rename itself: a moment too short to hit from outside.
AT_RENAME = """
import os, signal, sys
real = os.replace
def paused(src, dst):
    if "/encoded/" in str(dst) and "-train-" in str(dst):
        os.kill(os.getpid(), signal.SIGSTOP)
    return real(src, dst)
os.replace = paused
from seq2seq.commands import main  # argv: -c -m seq2seq prepare FLAGS...
sys.exit(main(sys.argv[3:]))
"""


def _stopped(pid: int) -> bool:
    """Whether process `pid` is stopped by a signal (state T in /proc)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
    except OSError:
        return False


def _group_gone(pgid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


KILLS = [
    (phase, whom) for phase in ("tokenizer", "encoding", "renames") for whom in ("parent", "group")
]


@pytest.mark.parametrize(("phase", "whom"), KILLS)
def test_a_killed_preparation_restarts_to_the_cache_of_a_clean_build(
    corpus_and_clean_cache: tuple[Path, dict], tmp_path: Path, phase: str, whom: str
) -> None:
    corpus, clean = corpus_and_clean_cache
    cache, log = tmp_path / "cache", tmp_path / "killed.log"
    rng = random.Random(f"{phase}-{whom}")  # seeded: the same moments on every run
    # At a rename the builder has stopped itself right before renaming the whole training split.
    window = {"tokenizer": 0.4, "encoding": 0.6, "renames": 0.0}[phase]
    args = _prepare_args(corpus, cache)
    if phase == "renames":
        args = [args[0], "-c", AT_RENAME, *args[1:]]
    with open(log, "w") as stderr:
        run = subprocess.Popen(
            args, env=_env(), stdout=subprocess.DEVNULL, stderr=stderr,
            start_new_session=True,  # its own process group: the workers join it
        )  # fmt: skip
        try:
            _wait_for(phase, run, log, cache)
            time.sleep(rng.uniform(0, window))
            if whom == "group":
                # What a scheduler does when the grace period after its SIGTERM is over.
                os.killpg(run.pid, signal.SIGKILL)
            else:
                run.send_signal(signal.SIGKILL)  # what the OOM killer does: the builder alone
            assert run.wait(10) == -signal.SIGKILL, "finished before it could be killed"
        finally:
            if run.poll() is None:
                os.killpg(run.pid, signal.SIGKILL)
    # The encoding workers die with the builder: nothing of the killed run keeps running.
    assert _group_gone(run.pid, 10), "a process of the killed preparation is still alive"

    start = time.monotonic()
    restart = subprocess.run(
        _prepare_args(corpus, cache), env=_env(), capture_output=True, text=True,
        timeout=RESTART_SECONDS,  # a hang fails here
    )  # fmt: skip
    assert restart.returncode == 0, restart.stderr
    assert "waiting for" not in restart.stderr  # nothing of the killed run held the lock
    assert time.monotonic() - start < RESTART_SECONDS
    assert _contents(cache) == clean  # complete, identical, and no temporary left behind


def test_a_waiting_process_names_the_builder_it_waits_for(
    corpus_and_clean_cache: tuple[Path, dict], tmp_path: Path
) -> None:
    corpus, clean = corpus_and_clean_cache
    cache, log = tmp_path / "cache", tmp_path / "first.log"
    with open(log, "w") as stderr:
        first = subprocess.Popen(
            _prepare_args(corpus, cache), env=_env(), stdout=subprocess.DEVNULL, stderr=stderr
        )
        try:
            _wait_for("tokenizer", first, log, cache)
            second = subprocess.run(
                _prepare_args(corpus, cache), env=_env(), capture_output=True, text=True,
                timeout=RESTART_SECONDS,
            )  # fmt: skip
            assert first.wait(RESTART_SECONDS) == 0
        finally:
            if first.poll() is None:
                first.kill()
    assert second.returncode == 0, second.stderr
    assert f"waiting for pid {first.pid} on " in second.stderr
    assert "already prepared" in second.stdout  # it read what the first one built
    assert _contents(cache) == clean


NO_LOCK = """
import contextlib, socket, sys, time
from pathlib import Path
import seq2seq.data.prepare as prepare
prepare.exclusive = lambda *args: contextlib.nullcontext()  # a lock that does not reach the other
socket.gethostname = lambda: sys.argv[1]  # another machine: its temporaries are not ours to judge
go = Path(sys.argv[2])
while not go.exists():  # both start building at once
    time.sleep(0.01)
from seq2seq.commands import main  # argv: -c HOST GO -m seq2seq prepare FLAGS...
sys.exit(main(sys.argv[5:]))
"""


def test_two_builders_the_lock_does_not_reach_end_with_one_cache(
    corpus_and_clean_cache: tuple[Path, dict], tmp_path: Path
) -> None:
    # Two machines on a filesystem whose locks are local to each (NFS `nolock`, Lustre `localflock`):
    # both build at once. Neither may delete the other's work; both finish on one complete cache.
    corpus, clean = corpus_and_clean_cache
    cache, go = tmp_path / "cache", tmp_path / "go"
    runs = [
        subprocess.Popen([sys.executable, "-c", NO_LOCK, host, str(go),
                          *_prepare_args(corpus, cache)[1:]],
                         env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for host in ("node-a", "node-b")
    ]  # fmt: skip
    go.touch()
    try:
        results = {host: (*run.communicate(timeout=RESTART_SECONDS), run.returncode)
                   for host, run in zip(("node-a", "node-b"), runs, strict=True)}  # fmt: skip
    finally:
        for run in runs:
            if run.poll() is None:
                run.kill()
    # Each builder's whole stderr when anything below fails: a race shows in one of them only.
    said = "\n".join(f"--- {host}: status {code}; stderr:\n{err}"
                     for host, (_, err, code) in results.items())  # fmt: skip
    assert [code for _, _, code in results.values()] == [0, 0], said
    # Both built (neither found the cache complete when it looked): the race was real. Which of them
    # encodes the training split depends on timing: a builder that reaches it after the other has
    # published it finds it complete and keeps it; at least one encoded it, and nothing was lost.
    assert all("built: cache" in out for out, _, _ in results.values()), said
    assert any("encoded train:" in err for _, err, _ in results.values()), said
    assert _contents(cache) == clean, said


TRAIN = ("-m", "seq2seq", "train")  # `python -m seq2seq train`


def test_training_killed_while_writing_a_checkpoint_resumes_to_its_last_step(
    tiny_corpus: Path, tmp_path: Path
) -> None:
    from seq2seq.atomic import TEMP_SUFFIX
    from tests.conftest import tiny_train_args

    # A wider model than the tiny one, so that a checkpoint takes a while to write and fsync.
    args = tiny_train_args(tiny_corpus, tmp_path / "runs", "--hidden-size", "512",
                           "--emb-size", "64", "--val-every", "2", "--max-epochs", "1000")  # fmt: skip
    ckpts = tmp_path / "runs" / "rnn-additive" / "version_0" / "checkpoints"
    run = subprocess.Popen([sys.executable, *TRAIN, *args, "--max-steps", "400"], cwd=tmp_path,
                           env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and run.poll() is None:
            # A run killed in its very first write has nothing to resume: wait for one whole one.
            whole = (ckpts / "last.ckpt").exists()
            if whole and list(ckpts.glob(f".*.ckpt.*{TEMP_SUFFIX}")):
                run.send_signal(signal.SIGKILL)  # mid-write: the temporary is still there
                break
            time.sleep(0.001)
        assert run.wait(10) == -signal.SIGKILL, "finished before it could be killed"
    finally:
        if run.poll() is None:
            run.kill()
    assert list(ckpts.glob(f".*.ckpt.*{TEMP_SUFFIX}")), "the kill came after the write"
    target = torch.load(ckpts / "last.ckpt", weights_only=False)["global_step"] + 3
    resumed = subprocess.run(
        [sys.executable, *TRAIN, *args, "--max-steps", str(target), "--resume"], cwd=tmp_path,
        env=_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert torch.load(ckpts / "last.ckpt", weights_only=False)["global_step"] == target
    assert not list(ckpts.glob(f".*{TEMP_SUFFIX}"))  # the torn write is gone


def _descendants(root: int) -> dict[int, bytes]:
    """Command lines of the processes below `root`, found through /proc's parent links (torchrun
    starts its workers in sessions of their own, so the process group does not find them)."""
    parents, commands = {}, {}
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit():
                stat = (proc / "stat").read_text()
                parents[int(proc.name)] = int(stat.rsplit(")", 1)[1].split()[1])
                commands[int(proc.name)] = (proc / "environ").read_bytes()
        except OSError:
            continue
    found, frontier = {}, [root]
    while frontier:
        parent = frontier.pop()
        for pid, ppid in parents.items():
            if ppid == parent and pid not in found:
                found[pid] = commands.get(pid, b"")
                frontier.append(pid)
    return found


def _alive(pids: list[int], seconds: float) -> list[int]:
    """Those of `pids` still running after up to `seconds` (zombies count as gone)."""
    deadline = time.monotonic() + seconds
    while True:
        left = []
        for pid in pids:
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if state != "Z":
                left.append(pid)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads /proc (Linux)")
def test_torchrun_with_one_rank_killed_ends_and_resumes_to_its_last_step(
    tiny_corpus: Path, tmp_path: Path
) -> None:
    from tests.e2e.test_ddp import ddp_flags, free_port

    flags = ddp_flags(tiny_corpus, tmp_path, "--val-every", "5", "--devices", "2")
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
               "--master-addr", "127.0.0.1", "--master-port", str(free_port()), *TRAIN,
               *flags]  # fmt: skip
    env = {**_env(), "OMP_NUM_THREADS": "1"}
    ckpts = tmp_path / "runs" / "rnn-additive" / "version_0" / "checkpoints"
    run = subprocess.Popen([*command, "--max-steps", "2000"], cwd=tmp_path, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not (ckpts / "last.ckpt").exists() and time.monotonic() < deadline:
            assert run.poll() is None, "torchrun ended before its first checkpoint"
            time.sleep(0.05)
        job = _descendants(run.pid)
        ranks = [pid for pid, env in job.items() if b"LOCAL_RANK=" in env]
        victim = next(pid for pid, env in job.items() if b"\0LOCAL_RANK=1\0" in b"\0" + env)
        assert len(ranks) >= 2
        os.kill(victim, signal.SIGKILL)  # one rank of two: an OOM kill on one node
        assert run.wait(90) != 0  # torchrun sees the failure and stops the other rank
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    assert not _alive(list(job), 30), "a process of the killed job is still alive"
    resumed = subprocess.run([*command, "--max-steps", "40", "--resume"], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=180)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert torch.load(ckpts / "last.ckpt", weights_only=False)["global_step"] == 40


def test_a_shard_overwritten_in_place_is_rebuilt_at_the_next_start(
    tiny_corpus: Path, tmp_path: Path
) -> None:
    from tests.conftest import tiny_train_args

    args = tiny_train_args(tiny_corpus, tmp_path / "runs", "--max-steps", "2")
    train = [sys.executable, *TRAIN, *args]
    first = subprocess.run(train, cwd=tmp_path, env=_env(), capture_output=True, text=True,
                           timeout=300)  # fmt: skip
    assert first.returncode == 0, first.stderr[-2000:]
    (split,) = (tmp_path / "data" / "cache" / "encoded").glob("*-train-*")
    shard = split / "shard-00000.arrow"
    data = bytearray(shard.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 64] = b"\xff" * 64  # a block gone bad: the same size, other bytes
    shard.write_bytes(bytes(data))
    # A requeued job: it rebuilds the split under the cache's lock and trains, with no one acting.
    again = subprocess.run([*train, "--run-name", "again"], cwd=tmp_path, env=_env(),
                           capture_output=True, text=True, timeout=300)  # fmt: skip
    assert again.returncode == 0, again.stderr[-2000:]
    assert (
        f"prepare: {split.relative_to(tmp_path)}: damaged (shard-00000.arrow does not match its "
        "SHA-256 in meta.json); rebuilding it"
    ) in again.stderr.splitlines()
    assert shard.read_bytes() != bytes(data)
