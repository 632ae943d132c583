"""Storage faults: real write failures (`ulimit -f`) while the tokenizer, a shard or a checkpoint is
written."""

import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, tiny_train_args
from tests.unit.data.test_storage import (
    corpus,  # noqa: F401 (a fixture, used by name)
)


def _limited(max_bytes: int) -> None:
    """In the child: no file may grow past `max_bytes` (EFBIG, with SIGXFSZ ignored), as `ulimit -f`."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (max_bytes, max_bytes))


def _run(args: list[str], cwd: Path, max_bytes: int) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "HF_DATASETS_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
    }
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300, preexec_fn=lambda: _limited(max_bytes))  # fmt: skip


def _published(cache: Path) -> list[str]:
    return sorted(
        str(p.relative_to(cache)) for p in cache.rglob("*") if not p.name.endswith(".lock")
    )


@pytest.mark.parametrize("what, limit", [("tokenizer", 2_000), ("encoded split 'train'", 300_000)])
def test_a_write_that_fails_publishes_nothing_and_says_what(
    corpus: Path,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
    what: str,
    limit: int,
) -> None:
    cache = tmp_path / "cache"
    flags = ["--data-dir", str(corpus), "--cache-dir", str(cache), "--vocab-size", "100"]
    done = _run(["-m", "seq2seq", "prepare", *flags], tmp_path, limit)
    assert done.returncode == 2, done.stderr[-2000:]
    error = done.stderr.strip().splitlines()[-1]
    assert error == f"error: --cache-dir {cache}: cannot write the {what} (File too large)"
    if what == "tokenizer":
        assert _published(cache) == []  # no model, no checksum, no temporary
    else:  # the tokenizer was whole and stays; of the split, neither a folder nor a temporary
        assert [p for p in _published(cache) if p.startswith("encoded/")] == []
        assert len([p for p in _published(cache) if p.startswith("spm-")]) == 2
    assert _run(["-m", "seq2seq", "prepare", *flags], tmp_path, 2**40).returncode == 0


def test_a_checkpoint_that_cannot_be_written_is_one_line_and_keeps_nothing_torn(
    tiny_corpus: Path, tmp_path: Path
) -> None:
    args = tiny_train_args(tiny_corpus, tmp_path / "runs", "--val-every", "5", "--max-steps", "10")
    prepared = _run(["-m", "seq2seq", "prepare", *args[:4]], tmp_path, 2**40)
    assert prepared.returncode == 0, prepared.stderr  # the cache first, without a limit
    done = _run(["-m", "seq2seq", "train", *args], tmp_path, 60_000)  # < a checkpoint
    assert done.returncode == 2, done.stderr[-2000:]
    ckpts = tmp_path / "runs" / "rnn-additive" / "version_0" / "checkpoints"
    assert done.stderr.strip().splitlines()[-1] == (
        f"error: {ckpts}/best-5.ckpt: cannot write the checkpoint (File too large)"
    )
    assert list(ckpts.iterdir()) == []  # no torn checkpoint, no temporary
