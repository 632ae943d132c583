"""Who may take a lock away: the lock file that stands in where POSIX locks fail (`held_file`), and a
record lock whose record names a process of another node (`exclusive(strict=True)`). Only a holder
known to be gone loses its lock; one whose life cannot be seen is waited for."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from seq2seq.data.cachelock import exclusive, held_file, held_path
from seq2seq.data.owners import Owner, _start_ticks
from seq2seq.errors import Stopped


def _dead_pid() -> int:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    return dead.pid


def test_a_link_retried_after_it_succeeded_is_this_process_s_own(tmp_path, monkeypatch) -> None:
    real = os.link

    def retried(src: Path, dst: Path) -> None:  # NFS: the reply was lost, the retry finds the name
        real(src, dst)
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(dst))

    monkeypatch.setattr(os, "link", retried)
    lock, said = tmp_path / "a.lock", []
    with held_file(lock, said.append, stop=lambda: "it waited for itself"):
        assert held_path(lock).read_text().strip() == Owner.me().tag
    assert not held_path(lock).exists() and said == []


def test_a_holder_whose_proc_entry_is_hidden_is_waited_for_not_taken_away(
    tmp_path, monkeypatch
) -> None:
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        me = Owner.me()
        other = Owner(me.host, sleeper.pid, _start_ticks(sleeper.pid))
        read_text = Path.read_text

        def hidden(path: Path, *args, **kwargs) -> str:  # as `hidepid` hides another user's
            if str(path) == f"/proc/{sleeper.pid}/stat":
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
            return read_text(path, *args, **kwargs)

        monkeypatch.setattr(Path, "read_text", hidden)
        assert other.alive() is None
        lock, said = tmp_path / "a.lock", []
        held_path(lock).write_text(f"{other.tag}\n")
        with pytest.raises(Stopped), held_file(lock, said.append, stop=lambda: "stopped"):
            pass
        assert held_path(lock).read_text().strip() == other.tag  # still its lock
        assert said[0] == f"waiting for {other} (lock file {held_path(lock).name})"
        assert said[1].endswith(f"if it does not, delete {held_path(lock)}")
    finally:
        sleeper.kill()
        sleeper.wait()
    # A pid of another PID namespace (a container on this host) names some other process here.
    dead = _dead_pid()
    assert Owner(me.host, dead, 1).alive() is False
    assert Owner(me.host, dead, 1, space="1").alive() is None


# A claimant of `lock` that holds it for 0.6 s, logging when it got and left it. The slow one judges
# the stale holder gone, then pauses until another claimant holds the lock, and acts on its
# judgement late, every file operation taking 0.2 s (a slow NFS server).
CLAIMANT = """
import os, sys, time
from pathlib import Path
from seq2seq.data import cachelock
from seq2seq.data.owners import Owner

lock, log, held, role = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
cachelock.POLL_SECONDS = 0.01
if role == "slow":
    judged = Owner.alive

    def alive(owner):
        answer = judged(owner)
        if answer is False:
            held.with_name("judged").touch()
            deadline = time.monotonic() + 20
            while not held.exists() and time.monotonic() < deadline:
                time.sleep(0.01)
            for name in ("link", "rename", "replace", "unlink"):
                def slow(*args, real=getattr(os, name), **kwargs):
                    time.sleep(0.2)
                    return real(*args, **kwargs)
                setattr(os, name, slow)
        return answer

    Owner.alive = alive
with cachelock.held_file(lock, lambda message: None):
    with open(log, "a") as out:
        out.write(f"got {os.getpid()} {time.monotonic()}\\n")
    held.touch()
    time.sleep(0.6)
    with open(log, "a") as out:
        out.write(f"left {os.getpid()} {time.monotonic()}\\n")
"""


def test_of_three_claimants_of_a_stale_lock_file_one_holds_it_at_a_time(tmp_path: Path) -> None:
    lock, log, held = tmp_path / "a.lock", tmp_path / "holders.log", tmp_path / "held"
    me = Owner.me()
    held_path(lock).write_text(f"{Owner(me.host, _dead_pid(), 1).tag}\n")  # killed -9

    def claimant(role: str) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-c", CLAIMANT, str(lock), str(log), str(held), role]
        )

    claimants = [claimant("slow")]
    deadline = time.monotonic() + 30
    while not (tmp_path / "judged").exists() and time.monotonic() < deadline:
        time.sleep(0.01)  # the slow one has judged the holder gone before the others start
    claimants += [claimant("quick"), claimant("quick")]
    assert [claimant.wait(60) for claimant in claimants] == [0, 0, 0]
    spans: dict[str, list[float]] = {}
    for line in log.read_text().splitlines():
        _, pid, when = line.split()
        spans.setdefault(pid, []).append(float(when))
    assert len(spans) == 3  # each held it once
    ordered = sorted(spans.values())
    overlaps = [(a, b) for a, b in zip(ordered, ordered[1:], strict=False) if a[1] > b[0]]
    assert overlaps == [], "two held the lock at once"
    assert not held_path(lock).exists()


def test_a_record_lock_named_as_held_on_another_node_is_not_taken(tmp_path: Path) -> None:
    lock, said = tmp_path / "a.lock", []
    other = Owner("node-b", 4242, 7)
    lock.write_text(f"{other.tag}\n")  # taken on node-b, where the file system's locks reach
    with pytest.raises(Stopped), exclusive(lock, said.append, lambda: "stopped", strict=True):
        pass
    assert lock.read_text().strip() == other.tag
    assert said[0] == (
        f"{lock} names {other} as its holder, though this host could lock it: the file system's "
        "locks reach one node only (NFS nolock, Lustre localflock), or that process was killed "
        f"there; if it no longer runs, empty the lock: truncate -s 0 {lock}"
    )
    os.truncate(lock, 0)  # released there, or emptied by a user as the message says
    with exclusive(lock, said.append, lambda: "stopped", strict=True):
        assert len(said) == 2  # taken at once
    # Left by a process of this host that is gone: the lock is the judge, as for the cache.
    lock.write_text(f"{Owner(Owner.me().host, _dead_pid(), 1).tag}\n")
    with exclusive(lock, said.append, lambda: "stopped", strict=True):
        assert len(said) == 2
