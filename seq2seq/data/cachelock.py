"""One builder per cache: an exclusive lock that names its holder, and temporaries owned by one process.

What a kill -9 leaves behind, and why it never blocks the next start:

- The lock is a POSIX record lock (`fcntl.lockf`), which belongs to the process that took it: the
  kernel drops it when that process dies, and processes it forks (the encoding workers) do not
  inherit it. (An `flock` lock belongs to the open file description, which forked children share: a
  builder killed while its workers lived left them holding the lock, and every later start waited.)
- Inside the lock file the holder writes who it is (seq2seq.data.owners: host, pid, process start
  time, PID namespace), so a waiting process says whom it waits for.
- A temporary file or folder carries its owner in its name. A builder removes only the temporaries
  of owners that are gone, never those of a live process or of one whose life it cannot see
  (another machine, another PID namespace, a hidden /proc entry): where the lock does not reach
  across machines (NFS mounted `nolock`, Lustre `localflock`), two builders then race to publish,
  and the first complete result wins.

A polite stop (`check_stop`) while waiting for the lock leaves nothing: the waiter never held it.

A study's run must never have two holders (`strict`). Where there are no POSIX locks, a lock file
stands in (`held_file`). Where they lock per node only (NFS `nolock`, Lustre `localflock`), each node
takes its own lock: the record a holder writes is then checked after taking it, and a lock whose
record names a process this host cannot see is released and waited for, not taken
(docs/guides/clusters.md says what a user does when that process is gone).
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import stat
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from seq2seq.data.owners import Owner
from seq2seq.errors import Stopped, UserError

POLL_SECONDS = 0.5  # how often a waiting process tries the lock again
# What a file system without locks answers: Lustre without flock (ENOSYS), NFS without a lock daemon
# (ENOLCK), others (EOPNOTSUPP, ENOTSUP). The build then goes on unlocked: publishing tolerates
# racing builders (temporaries by owner, renames that keep the first complete result).
NO_LOCKS = {errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP}


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
    strict: bool = False,
) -> Iterator[None]:
    """Hold the lock `lock` (created if missing) for the block; `log` tells the user when waiting;
    `stop`, asked at each try while another process holds it, ends the wait (`check_stop`).

    `strict`: two processes must never hold it at once (a study's run). Without POSIX locks a lock
    file stands in (`held_file`), and a lock whose record names a process this host cannot see is
    not taken while the record says so (`_recorded`). Otherwise (the cache, whose publishing
    tolerates racing builders) a file system without locks is built on unlocked."""
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
            if strict:
                with held_file(lock, log, stop):
                    yield
                return
            log(f"{lock.parent}: this file system has no locks; building without one")
            yield
            return
        waited_for = None
        while True:
            if _try_lock(fd, lock):
                recorded = _recorded(fd) if strict else None
                if recorded is None or recorded.alive() is False:
                    break  # no record (released), or its writer is gone: the lock is this one's
                # Locked on this node, and yet held by its record: the file system's locks reach
                # this node only. Released again, and waited for like any holder.
                fcntl.lockf(fd, fcntl.LOCK_UN)
                if recorded != waited_for:
                    log(_unseen(lock, recorded))
            found = _holder(lock)  # a fresh read: on NFS, opening the file again revalidates it
            if found != waited_for:  # said once per holder, not once per poll
                who = f"{found}" if found else "another process"
                log(f"waiting for {who} to finish preparing {lock.parent} (lock {lock.name})")
                waited_for = found
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


def _recorded(fd: int) -> Owner | None:
    """The holder the locked file `fd` names (through `fd`: see `exclusive`); None if none."""
    return Owner.from_tag(os.pread(fd, 4096, 0).decode(errors="replace").strip())


def _unseen(lock: Path, holder: Owner) -> str:
    """What a user reads when `holder`, whose life this host cannot see, holds `lock` by its record."""
    return (
        f"{lock} names {holder} as its holder, though this host could lock it: the file system's "
        f"locks reach one node only (NFS nolock, Lustre localflock), or that process was killed "
        f"there; if it no longer runs, empty the lock: truncate -s 0 {lock}"
    )


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
    block runs (`_claim` takes it). A holder that is gone (no such process on this host, or a
    reused pid) left it stale: it is taken away. A holder whose life cannot be seen from here
    (another machine, another PID namespace, a hidden /proc entry) is waited for, and the user told
    how to end the wait should it no longer run.

    What a kill leaves: this process's temporary (removed by the next claimant once its owner is
    gone), a stale lock file or a stale turn to take one away (`_claim`; both taken away in turn).
    """
    path, me = held_path(lock), Owner.me()
    waited_for = None
    remove_orphans(path, log)
    while not _claim(path, me, log):
        found = _holder(path)
        if found != waited_for:
            log(f"waiting for {found or 'another process'} (lock file {path.name})")
            if found is not None and found.alive() is None:
                log(
                    f"{path}: this host cannot see whether {found} still runs (another machine, "
                    f"another PID namespace, or a hidden /proc); if it does not, delete {path}"
                )
            waited_for = found
        check_stop(stop)
        time.sleep(POLL_SECONDS)
    try:
        yield
    finally:
        if _holder(path) == me:  # only its holder removes a live holder's file
            path.unlink(missing_ok=True)


def _claim(path: Path, me: Owner, log: Callable[[str], None]) -> bool:
    """One try at holding `path`: create it naming `me`; whether `me` holds it now.

    A file left by a process that is gone is taken away first. Every claimant that found it so
    races for the one turn to do that, a file beside it claimed this very way (so a claimant killed
    holding a turn is taken away in turn), and only the turn's holder removes the stale file, after
    checking under its turn that it still names the process that is gone. A file naming a live
    process is thus removed by that process alone, and of three or more claimants one holds it.
    """
    if _link(path, me):
        return True
    found = _holder(path)
    if found is None or found.alive() is not False:
        return False  # held (or just released): tried again after a poll
    turn = path.with_name(f".{path.name}.{found.tag}.turn")
    remove_orphans(turn, log)  # a killed claimant's temporaries of the turn
    if not _claim(turn, me, log):
        return False  # another claimant's turn
    try:
        if _holder(path) == found:  # not yet taken away: nobody else may, while this turn lasts
            path.unlink(missing_ok=True)
            log(f"removed {path.name}, left by {found}, which is gone")
        return _link(path, me)  # fails where a claimant quicker than this turn created it anew
    finally:
        turn.unlink(missing_ok=True)


def _link(path: Path, me: Owner) -> bool:
    """Create `path` naming `me`, whole (a temporary, hard-linked into place: the link fails when
    the name exists, on NFS too), unless it exists; whether `path` is this call's now."""
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
            # Over NFS a link whose reply was lost is sent again, and the retry finds the name
            # taken: by this very file when the first try succeeded.
            try:
                return os.path.samefile(tmp, path)
            except FileNotFoundError:
                return False
        return True
    finally:
        tmp.unlink(missing_ok=True)


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
