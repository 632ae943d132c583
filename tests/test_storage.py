"""Storage faults: real write failures (`ulimit -f`) while the tokenizer, a shard or a checkpoint is
written, a simulated full disk at meta.json, damaged caches found on load, a file system without
locks, and a lock file that a group can share."""

import errno
import json
import os
import resource
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from seq2seq.data import prepare as prep
from seq2seq.data.split_rows import SplitRows
from seq2seq.errors import UserError
from seq2seq.training.config import TrainConfig
from tests.conftest import tiny_train_args, write_corpus

ROOT = Path(__file__).resolve().parents[1]


def _cfg(corpus: Path, cache: Path) -> TrainConfig:
    return TrainConfig(data_dir=str(corpus), cache_dir=str(cache), vocab_size=100,
                       prepare_workers=1)  # fmt: skip


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


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Its training shard (~440 KB) is larger than its tokenizer (~240 KB, mostly the normalizer).
    return write_corpus(tmp_path_factory.mktemp("storage") / "c", {"train": 6000, "val": 20})


@pytest.mark.slow
@pytest.mark.parametrize("what, limit", [("tokenizer", 2_000), ("encoded split 'train'", 300_000)])
def test_a_write_that_fails_publishes_nothing_and_says_what(
    corpus: Path, tmp_path: Path, what: str, limit: int
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


def test_a_full_disk_at_meta_json_publishes_no_split(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Simulated: meta.json is the smallest file of a split, so `ulimit -f` cannot single it out.
    real = prep.atomic_write_text

    def full(path: Path, text: str) -> Path:
        if Path(path).name == "meta.json":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(path, text)

    monkeypatch.setattr(prep, "atomic_write_text", full)
    with pytest.raises(UserError, match=r"cannot write the encoded split 'train' \(No space left"):
        prep.prepare(_cfg(corpus, tmp_path))
    assert list((tmp_path / "encoded").iterdir()) == []


@pytest.mark.slow
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


def _cut_after_batches(shard: Path, batches: int) -> int:
    """Truncate an Arrow stream after its first `batches` record batches; returns the new size."""
    with pa.ipc.open_stream(pa.memory_map(str(shard))) as reader:
        schema, kept = reader.schema, list(reader)[:batches]
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        for batch in kept:
            writer.write_batch(batch)
    size = sink.getvalue().size - 8  # the same bytes, less the end-of-stream marker
    os.truncate(shard, size)
    return size


def test_a_shard_cut_at_a_record_batch_is_found_and_rebuilt(
    tiny_corpus: Path, tmp_path: Path, capsys
) -> None:
    first = prep.prepare(_cfg(tiny_corpus, tmp_path), chunk_size=50)  # 4 record batches
    train = first.paths["train"]
    _cut_after_batches(train / "shard-00000.arrow", 2)
    # Before meta.json recorded sizes (and digests), the cut file read as 100 rows without any error:
    meta = json.loads((train / "meta.json").read_text())
    (train / "meta.json").write_text(
        json.dumps({k: v for k, v in meta.items() if k not in ("shard_bytes", "shard_sha256")})
    )
    with pytest.raises(UserError) as found:
        SplitRows(train)
    assert str(found.value) == (
        f"{train}: damaged (100 rows in its shards, meta.json says 200); delete it to rebuild it"
    )
    (train / "meta.json").write_text(
        json.dumps(meta)
    )  # with sizes, preparation finds and rebuilds it
    capsys.readouterr()
    again = prep.prepare(_cfg(tiny_corpus, tmp_path), chunk_size=50)
    said = capsys.readouterr().err
    assert f"{train}: damaged (shard-00000.arrow has " in said and "; rebuilding it" in said
    assert again.built and len(SplitRows(again.paths["train"])) == 200


def test_an_empty_meta_json_is_found_and_rebuilt(tiny_corpus: Path, tmp_path: Path, capsys) -> None:
    first = prep.prepare(_cfg(tiny_corpus, tmp_path))
    (first.paths["val"] / "meta.json").write_text("")
    capsys.readouterr()
    again = prep.prepare(_cfg(tiny_corpus, tmp_path))
    said = capsys.readouterr().err
    assert (
        f"{first.paths['val']}: damaged (meta.json unreadable: JSONDecodeError); rebuilding it"
        in said
    )
    assert again.built and again.meta["val"]["rows"] == 20


def test_a_damaged_tokenizer_is_one_line_naming_it(tiny_corpus: Path, tmp_path: Path) -> None:
    first = prep.prepare(_cfg(tiny_corpus, tmp_path))
    model = first.tokenizer_file
    data = model.read_bytes()
    model.write_bytes(data[: len(data) * 2 // 3])  # still parses as a smaller tokenizer
    with pytest.raises(UserError) as found:
        prep.prepare(_cfg(tiny_corpus, tmp_path))
    assert str(found.value) == (
        f"{model}: damaged ({len(data) * 2 // 3:,} bytes that do not match its checksum "
        f"{model.name}.sha256); delete both to retrain"
    )


def test_a_file_system_without_locks_builds_with_a_warning(
    tiny_corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    import seq2seq.data.cachelock as cachelock

    def no_locks(fd: int, operation: int) -> None:  # what Lustre without flock answers
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))

    monkeypatch.setattr(cachelock.fcntl, "lockf", no_locks)
    prepared = prep.prepare(_cfg(tiny_corpus, tmp_path))
    assert prepared.built and prepared.meta["train"]["rows"] == 200
    said = capsys.readouterr().err
    assert f"prepare: {tmp_path}: this file system has no locks; building without one" in said


@pytest.mark.parametrize("folder_mode, lock_mode", [(0o775, 0o664), (0o755, 0o644)])
def test_the_lock_file_is_group_writable_where_its_folder_is(
    tmp_path: Path, folder_mode: int, lock_mode: int
) -> None:
    from seq2seq.data.cachelock import exclusive

    cache = tmp_path / "cache"
    cache.mkdir()
    cache.chmod(folder_mode)
    old = os.umask(0o022)  # the usual umask, which alone would make the lock 0644
    try:
        with exclusive(cache / "c.lock", print):
            pass
    finally:
        os.umask(old)
    assert stat.S_IMODE((cache / "c.lock").stat().st_mode) == lock_mode
