"""Who holds a lock or owns a temporary: a process named by its host, pid, start time and PID
namespace (`Owner`), and whether it still runs, as far as this process can see.

Liveness is answered in three words: True (it runs), False (it is gone: no such process, or its pid
now belongs to a later one) and None (it cannot be told from here: a process of another machine, of
another PID namespace, or one whose /proc entry is hidden, as `hidepid` hides other users'). Only
False lets a caller take away what the owner left; None is treated as alive.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Owner:
    """A process, told apart from a later one with the same pid by its start time, and from one of
    another PID namespace (a container on the same host) by that namespace."""

    host: str
    pid: int
    started: int  # start time in clock ticks since boot (Linux); 0 where unknown
    space: str = ""  # the PID namespace's inode number (Linux); "" where unknown

    @classmethod
    def me(cls) -> Owner:
        pid = os.getpid()
        return cls(socket.gethostname(), pid, _start_ticks(pid) or 0, _pid_space())

    @property
    def tag(self) -> str:
        """The owner as a name part: host~pid~start~namespace (hostnames have no '~')."""
        return f"{self.host}~{self.pid}~{self.started}~{self.space}"

    @classmethod
    def from_tag(cls, tag: str) -> Owner | None:
        parts = tag.split("~")
        if len(parts) == 3:  # written before the namespace was recorded
            parts.append("")
        if len(parts) != 4 or not all(part.isdigit() for part in parts[1:3]):
            return None
        if parts[3] and not parts[3].isdigit():
            return None
        return cls(parts[0], int(parts[1]), int(parts[2]), parts[3])

    def alive(self) -> bool | None:
        """True (it runs) or False (it is gone); None where this process cannot tell."""
        if self.host != socket.gethostname():
            return None  # another machine's pids mean nothing here
        if self.space and _pid_space() and self.space != _pid_space():
            return None  # nor do another PID namespace's
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass  # someone else's process: it exists
        started = _start_ticks(self.pid)
        if started is None:
            # Without /proc (macOS) the pid is all there is; with it, an entry that cannot be read
            # is hidden (hidepid), or its process ended a moment ago: unknown, asked again later.
            return None if Path("/proc/self/stat").exists() else True
        return started == self.started  # a reused pid is another process

    def __str__(self) -> str:
        return f"pid {self.pid} on {self.host}"


def _start_ticks(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat; None where it cannot be read (no /proc, the process is gone,
    or its entry is hidden)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])  # fields after "(comm)" start at field 3


def _pid_space() -> str:
    """This process's PID namespace, as the number in /proc/self/ns/pid's "pid:[4026531836]"."""
    try:
        return os.readlink("/proc/self/ns/pid").split("[")[1].rstrip("]")
    except (OSError, IndexError):
        return ""
