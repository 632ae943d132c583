"""benchmark_scale.py --json publishes its figures whole or not at all (seq2seq.atomic): a write
that runs out of room (`ulimit -f` here, a full disk alike) leaves the previous file as it was."""

import json
import subprocess
import sys
from pathlib import Path

# The benchmark with its children replaced by a finished preparation, its file size limited to
# fewer bytes than the figures take: the write of --json fails part way.
CHILD = """
import resource, signal, sys
from seq2seq.benchmarks import scale
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG) instead
scale.write_synthetic = lambda folder, pairs, seed=0: folder
scale.run_child = lambda args, log: {"status": 0, "output": "", "seconds": 1.0, "cpu_s": 1.0,
                                     "max_rss_mb": 1.0, "tree_pss_mb": 1.0}
resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64))
sys.exit(scale.main(["--pairs", "5", "--no-train", "--work", sys.argv[1], "--json", sys.argv[2]]))
"""


def test_a_json_file_that_cannot_be_written_whole_keeps_the_previous_one(tmp_path: Path) -> None:
    figures = tmp_path / "scale.json"
    before = json.dumps({"pairs": 3})  # a previous run's figures, under the limit
    figures.write_text(before)
    child = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "work"), str(figures)],
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    assert child.returncode != 0 and "File too large" in child.stderr, child.stderr[-2000:]
    assert figures.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scale.json", "work"]  # no temporary
