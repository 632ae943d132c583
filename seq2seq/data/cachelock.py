"""One builder per cache: an exclusive lock that names its holder, and temporaries owned by one process.

What a kill -9 leaves behind, and why it never blocks the next start:

- The lock is a POSIX record lock (`fcntl.lockf`), which belongs to the process that took it: the
  kernel drops it when that process dies, and processes it forks (the encoding workers) do not
  inherit it. (An `flock` lock belongs to the open file description, which forked children share: a
  builder killed while its workers lived left them holding the lock, and every later start waited.)
- Inside the lock file the holder writes who it is (host, pid, process start time), so a waiting
  process says whom it waits for.
- A temporary file or folder carries its owner in its name. A builder removes only the temporaries
  of owners that are gone (same host, no such live process), never those of a live process or of
  another machine: where the lock does not reach across machines (NFS mounted `nolock`, Lustre
  `localflock`), two builders then race to publish, and the first complete result wins.

A polite stop (`check_stop`) while waiting for the lock leaves nothing: the waiter never held it.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import socket
import stat
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from seq2seq.errors import Stopped, UserError

POLL_SECONDS = 0.5  # how often a waiting process tries the lock again
# What a file system without locks answers: Lustre without flock (ENOSYS), NFS without a lock daemon
# (ENOLCK), others (EOPNOTSUPP, ENOTSUP). The build then goes on unlocked: publishing tolerates
# racing builders (temporaries by owner, renames that keep the first complete result).
NO_LOCKS = {errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP}


@dataclass(frozen=True)
class Owner:
    """A process, told apart from a later one with the same pid by its start time."""

    host: str
    pid: int
    started: int  # start time in clock ticks since boot (Linux); 0 where unknown

    @classmethod
    def me(cls) -> Owner:
        return cls(socket.gethostname(), os.getpid(), _start_ticks(os.getpid()))

    @property
    def tag(self) -> str:
        """The owner as a name part: host~pid~start (hostnames have no '~')."""
        return f"{self.host}~{self.pid}~{self.started}"

    @classmethod
    def from_tag(cls, tag: str) -> Owner | None:
        parts = tag.split("~")
        if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
            return None
        return cls(parts[0], int(parts[1]), int(parts[2]))

    def alive(self) -> bool | None:
        """True or False on this host; None (cannot tell) for a process of another machine."""
        if self.host != socket.gethostname():
            return None
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass  # someone else's process: it exists
        return _start_ticks(self.pid) == self.started  # a reused pid is another process

    def __str__(self) -> str:
        return f"pid {self.pid} on {self.host}"


def _start_ticks(pid: int) -> int:
    """Field 22 of /proc/<pid>/stat; 0 where there is no /proc (macOS) or the process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(stat.rsplit(")", 1)[1].split()[19])  # fields after "(comm)" start at field 3


def check_stop(stop: Callable[[], str | None] | None) -> None:
    """Raise `Stopped` (nothing new saved) when `stop` gives a reason to stop politely."""
    reason = stop() if stop is not None else None
    if reason is not None:
        raise Stopped(reason, None, None)


@contextmanager
def exclusive(
    lock: Path,
    log: Callable[[str], None],
    stop: Callable[[], str | None] | None = None,
    without_locks: str = "go on",
) -> Iterator[None]:
    """Hold the lock `lock` (created if missing) for the block; `log` tells the user when waiting;
    `stop`, asked at each try while another process holds it, ends the wait (`check_stop`).

    `without_locks` says what happens on a file system without POSIX locks: "go on" unlocked (the
    cache, whose publishing tolerates racing builders) or "lock file" (`held_file`: the study's
    runs, where two processes must never train one run)."""
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        fd = _open_shared(lock)
    except PermissionError as err:
        if lock.exists() and os.access(lock.parent, os.W_OK):  # another user's private lock file
            raise UserError(
                f"`cache_dir` {lock.parent}: cannot open the lock file {lock.name} "
                f"({err.strerror}); its owner can share it: chmod g+w {lock}"
            ) from None
        raise UserError(f"`cache_dir` {lock.parent}: cannot write there ({err.strerror})") from None
    except OSError as err:
        raise UserError(f"`cache_dir` {lock.parent}: cannot write there ({err.strerror})") from None
    try:
        if not _lockable(fd):
            if without_locks == "lock file":
                with held_file(lock, log, stop):
                    yield
                return
            log(f"{lock.parent}: this file system has no locks; building without one")
            yield
            return
        waited_for = None
        while not _try_lock(fd, lock):
            holder = _holder(lock)
            if holder != waited_for:  # said once per holder, not once per poll
                who = f"{holder}" if holder else "another process"
                log(f"waiting for {who} to finish preparing {lock.parent} (lock {lock.name})")
                waited_for = holder
            check_stop(stop)
            time.sleep(POLL_SECONDS)
        # Through the locked descriptor: opening and closing the file again here would drop the lock.
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{Owner.me().tag}\n".encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)  # a released lock names no holder
            fcntl.lockf(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def held_path(lock: Path) -> Path:
    """The lock file `held_file` creates beside `lock`."""
    return lock.with_name(lock.name + ".held")


def holder(lock: Path) -> Owner | None:
    """Who holds `lock`, as it says (its record lock's holder, or `held_file`'s); None if unknown."""
    return _holder(held_path(lock)) or _holder(lock)


@contextmanager
def held_file(
    lock: Path, log: Callable[[str], None], stop: Callable[[], str | None] | None = None
) -> Iterator[None]:
    """An exclusive lock without POSIX locks: `held_path(lock)` exists, naming its holder, while the
    block runs. It is published whole (written under this process's temporary name, then hard-
    linked into place, which fails when the name exists, on NFS too). A holder dead on this host
    (no such process, or a reused pid) left it stale: it is taken away and the claim tried again. A
    holder on another machine cannot be judged from here, and is waited for.

    What a kill leaves: before the link, this process's temporary (removed by the next claimant
    once its owner is gone); after it, a stale lock file (taken away by the next claimant on this
    host). Two claimants taking away the same stale file at the same moment: one renames it away;
    the other finds it gone and tries its claim again.
    """
    path, me = held_path(lock), Owner.me()
    waited_for = None
    remove_orphans(path, log)
    while not _claim(path, me):
        found = _holder(path)
        if found is not None and found.alive() is False:
            _take_away(path, found, log)
            continue
        if found != waited_for:
            log(f"waiting for {found or 'another process'} (lock file {path.name})")
            waited_for = found
        check_stop(stop)
        time.sleep(POLL_SECONDS)
    try:
        yield
    finally:
        if _holder(path) == me:
            path.unlink(missing_ok=True)


def _claim(path: Path, me: Owner) -> bool:
    """Create `path` naming `me`, unless it exists; whether this call created it."""
    tmp = temporary_name(path)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, f"{me.tag}\n".encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        return True
    finally:
        tmp.unlink(missing_ok=True)


def _take_away(path: Path, stale: Owner, log: Callable[[str], None]) -> None:
    """Remove `path`, which names `stale`, a dead process; one that names anyone else by now (a
    claimant was quicker) is put back."""
    grave = path.with_name(f".{path.name}.{Owner.me().tag}.stale")
    try:
        os.rename(path, grave)
    except FileNotFoundError:
        return  # another claimant took it away first
    if _holder(grave) == stale:
        log(f"removed {path.name}, left by {stale}, which is gone")
    else:
        with suppress(FileExistsError):
            os.link(grave, path)
    grave.unlink(missing_ok=True)


def _open_shared(lock: Path) -> int:
    """Open (or create) the lock file so that whoever may write in its folder may lock it: a cache
    shared by a group is group-writable, and so is its lock (the umask would make it 0644)."""
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    folder = os.stat(lock.parent).st_mode
    wanted = 0o644 | (folder & (stat.S_IWGRP | stat.S_IWOTH))
    try:
        if os.fstat(fd).st_mode & 0o777 != wanted:
            os.fchmod(fd, wanted)
    except PermissionError:  # another user's lock file: its owner set its mode
        pass
    return fd


def _lockable(fd: int) -> bool:
    """Whether the file system can lock at all (held by another process counts as yes)."""
    try:
        fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except (BlockingIOError, PermissionError):
        return True
    except OSError as err:
        if err.errno in NO_LOCKS:
            return False
        raise
    fcntl.lockf(fd, fcntl.LOCK_UN)
    return True


def _try_lock(fd: int, lock: Path) -> bool:
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except (BlockingIOError, PermissionError):  # EAGAIN or EACCES: held by another process
        return False


def _holder(lock: Path) -> Owner | None:
    try:
        return Owner.from_tag(lock.read_text().strip())
    except OSError:
        return None


def temporary_name(target: Path) -> Path:
    """A temporary path beside `target` that names this process as its owner."""
    return target.with_name(f".{target.name}.{Owner.me().tag}.tmp")


def remove_orphans(target: Path, log: Callable[[str], None]) -> None:
    """Remove the temporaries of `target` whose owner is gone; leave those of live processes and of
    other machines (whose liveness cannot be seen from here)."""
    prefix, mine = f".{target.name}.", temporary_name(target)
    for path in target.parent.glob(f"{prefix}*"):
        rest = path.name[len(prefix) :].removesuffix(".tmp")
        # An owner's tag; none in the random names of earlier versions, whose builders are gone.
        owner = Owner.from_tag(rest)
        if owner is None and "." in rest:
            # Not a temporary of `target` but of a file named after it: the checksum's
            # `.<model>.sha256.<random>.tmp`, which a live builder may be renaming this moment.
            continue
        if path == mine or (owner is not None and owner.alive() is not False):
            continue
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        log(f"removed {path.name}, left by a preparation that was killed")


def die_with_parent(parent: int) -> None:
    """In a worker process: be killed when the process that started it dies (Linux), so a killed
    builder leaves no worker behind; exit at once if that has already happened."""
    if sys.platform == "linux":
        import ctypes
        import signal

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before the line above took effect
        os._exit(1)
