"""Publishing a file whole or not at all: write a temporary beside it, fsync, rename, fsync the folder.

A reader (another process, or the next start after a kill -9 or a power cut) sees the old file or the
new one, never a torn one. A write that fails (a full disk, a quota, `ulimit -f`) removes its
temporary and raises: nothing half-written is ever renamed into place.
"""

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import BinaryIO

from seq2seq.errors import UserError

TEMP_SUFFIX = ".tmp"


def fsync_folder(folder: str | Path) -> None:
    """Make a rename inside `folder` survive a power cut (a no-op where folders cannot be opened)."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write(path: str | Path, write: Callable[[BinaryIO], None], mode: int = 0o644) -> Path:
    """Call `write(file)` on a temporary beside `path`, then publish it as `path`; returns `path`.

    The temporary is `.<name>.<random>.tmp` in the same folder, so the rename never crosses a file
    system, and a killed writer's leftover is easy to recognise.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TEMP_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())  # the bytes reach the disk before the name points at them
        os.chmod(tmp, mode)  # mkstemp makes the file private; published files are shared
        os.replace(tmp, path)
    except BaseException:  # KeyboardInterrupt too: no temporary outlives a failed write
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_folder(path.parent)
    return path


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Publish `data` as `path`, whole or not at all."""
    return atomic_write(path, lambda file: file.write(data))


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Publish `text` (UTF-8) as `path`, whole or not at all."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def check_writable(folder: str | Path, label: str) -> None:
    """Refuse a folder (a log folder, a file's) that cannot be written, before any work, creating nothing.

    The nearest existing ancestor must be a folder in which a file can be created (tried for real:
    permission bits say nothing about read-only mounts, and root ignores them). `label` starts the
    message: the flag the folder came from.
    """
    probe = Path(folder)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise UserError(f"{label}: {probe} is a file, not a folder")
    try:
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as err:
        raise UserError(f"{label}: cannot write in {probe} ({err.strerror})") from None


def check_writable_file(
    path: str | Path, label: str, inputs: Iterable[str | Path | None] = ()
) -> None:
    """Refuse, before the work whose result it is to hold, a file that could not be written or that
    would replace one of the command's `inputs` (its checkpoint, sources, references): a folder, a
    path under a file, one in a read-only folder, an input itself. A device or pipe that exists
    (/dev/null, /dev/stdout) passes; nothing is created."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{label}: a folder, not a file")
    for given in inputs:
        if given is not None and path.exists() and Path(given).exists():
            if path.samefile(given):
                raise UserError(
                    f"{label}: is the input {given}, which stays as it is (give a new path)"
                )
    if not path.exists() or path.is_file():
        check_writable(path.parent, label)
