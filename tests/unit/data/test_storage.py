"""Storage faults: a simulated full disk at meta.json, damaged caches found on load, a file system
without locks, and a lock file that a group can share (real write failures, `ulimit -f`:
tests/e2e/test_storage.py)."""

import errno
import json
import os
import stat
from pathlib import Path

import pyarrow as pa
import pytest

from seq2seq.data import prepare as prep
from seq2seq.data.shards import SplitRows
from seq2seq.errors import UserError
from seq2seq.training.config import TrainConfig
from tests.conftest import write_corpus


def _cfg(corpus: Path, cache: Path) -> TrainConfig:
    return TrainConfig(data_dir=str(corpus), cache_dir=str(cache), vocab_size=100,
                       prepare_workers=1)  # fmt: skip


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Its training shard (~440 KB) is larger than its tokenizer (~240 KB, mostly the normalizer).
    return write_corpus(tmp_path_factory.mktemp("storage") / "c", {"train": 6000, "val": 20})


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


def test_a_shard_overwritten_in_place_is_found_and_rebuilt(
    tiny_corpus: Path, tmp_path: Path, capsys
) -> None:
    first = prep.prepare(_cfg(tiny_corpus, tmp_path))
    shard = first.paths["train"] / "shard-00000.arrow"
    written = shard.read_bytes()
    middle = len(written) // 2
    damaged = written[:middle] + b"\xff" * 64 + written[middle + 64 :]  # the same size
    shard.write_bytes(damaged)
    capsys.readouterr()
    again = prep.prepare(_cfg(tiny_corpus, tmp_path))
    said = capsys.readouterr().err
    assert (
        f"{first.paths['train']}: damaged (shard-00000.arrow does not match its SHA-256 in "
        "meta.json); rebuilding it"
    ) in said
    assert again.built and shard.read_bytes() == written  # the same corpus, encoded again
    assert len(SplitRows(again.paths["train"])) == first.meta["train"]["rows"]
