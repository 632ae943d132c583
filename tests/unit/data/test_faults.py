"""What a killed builder leaves: only the temporaries of owners that are gone are removed (the kills
themselves: tests/e2e/test_faults.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_only_the_temporaries_of_dead_owners_are_removed(tmp_path: Path) -> None:
    from seq2seq.data.cachelock import remove_orphans, temporary_name
    from seq2seq.data.owners import Owner, _start_ticks

    target = tmp_path / "split-f1"
    me = Owner.me()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    names = {
        "mine": temporary_name(target),
        "dead": target.with_name(f".{target.name}.{Owner(me.host, dead.pid, 1).tag}.tmp"),
        "reused pid": target.with_name(f".{target.name}.{Owner(me.host, me.pid, 1).tag}.tmp"),
        "live": target.with_name(
            f".{target.name}.{Owner(me.host, 1, _start_ticks(1) or 0).tag}.tmp"
        ),
        "other host": target.with_name(f".{target.name}.{Owner('node-b', me.pid, 5).tag}.tmp"),
        "old version": target.with_name(f".{target.name}.k2j3h4"),
        # Not a temporary of `target`: atomic_write's of its checksum, `target.sha256` (a live
        # builder on a machine the lock does not reach may be renaming it this moment).
        "checksum's": target.with_name(f".{target.name}.sha256.n6r_r9_r.tmp"),
    }
    for path in names.values():
        path.mkdir()
    (names["dead"] / "shard-00000.arrow").write_bytes(b"half")
    said: list[str] = []
    remove_orphans(target, said.append)
    left = {name for name, path in names.items() if path.exists()}
    assert left == {"mine", "live", "other host", "checksum's"} and len(said) == 3
