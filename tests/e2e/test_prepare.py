"""The preparation step's one builder among many processes: two processes on a cold cache build it
once."""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

from tests.unit.data.test_prepare import _cfg

CHILD = """
import json, os, sys, time, types
from pathlib import Path
from seq2seq.data import prepare as prep
cfg, go = types.SimpleNamespace(**json.loads(sys.argv[1])), Path(sys.argv[2])
real = prep._encode_split
prep._encode_split = lambda *args: time.sleep(0.5) or real(*args)  # hold the lock a while
while not go.exists():  # both processes start before either prepares
    time.sleep(0.01)
prepared = prep.prepare(cfg)
print(json.dumps([prepared.built, os.stat(prepared.paths["train"]).st_ino]))
"""


def test_two_processes_on_a_cold_cache_build_it_once(tiny_corpus: Path, tmp_path: Path) -> None:
    # Fresh interpreters, as torchrun or SLURM start them; the config travels as plain values.
    cfg, go = json.dumps(dataclasses.asdict(_cfg(tiny_corpus, tmp_path))), tmp_path / "go"
    run = [sys.executable, "-c", CHILD, cfg, str(go)]
    children = [
        subprocess.Popen(run, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in "ab"
    ]
    go.touch()
    outcomes = [child.communicate(timeout=120) for child in children]
    assert all(child.returncode == 0 for child in children), outcomes
    (built_a, inode_a), (built_b, inode_b) = (json.loads(out) for out, _ in outcomes)
    assert (
        sorted([built_a, built_b]) == [False, True] and inode_a == inode_b
    )  # one folder, read by both
    # The other one waited, and said whom for: the builder, by its pid.
    builder, waiter = (0, 1) if built_a else (1, 0)
    assert "waiting for" not in outcomes[builder][1]
    assert f"waiting for pid {children[builder].pid} on " in outcomes[waiter][1]
