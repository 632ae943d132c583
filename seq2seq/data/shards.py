"""A prepared split on disk: Arrow IPC stream shards of SHARD_PAIRS rows and the meta.json that
names them, as seq2seq.data.prepare writes them and the DataModule reads them back (checked against
meta.json: a split that is not what it says is a DamagedSplit); `SplitRows` reads its rows one
batch at a time with `os.pread`, so that training memory does not follow the size of the corpus.

Columns: index (uint32), src_len, tgt_len (uint16, saturating), src_ids, tgt_ids (uint16 ids; uint32
over 65,536 pieces), `links` (list<uint16>) with guided alignment, and the raw `src` and `tgt` text
in every split but train.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from torch.utils.data import Dataset

from seq2seq.data.corpus import Pairs
from seq2seq.errors import UserError

SHARD_PAIRS = 1_000_000  # rows per shard file (~150 MB of joined Multi30k pairs)


class DamagedSplit(UserError):
    """A prepared split that is not what its meta.json says (a crash soon after it was written, an
    interrupted copy): `folder` is rebuilt."""

    def __init__(self, folder: Path, problem: str) -> None:
        super().__init__(f"{folder}: damaged ({problem}); delete it to rebuild it")
        self.folder, self.problem = folder, problem


def read_meta(folder: Path) -> dict[str, Any]:
    """A split's meta.json, checked against the shards on disk (their sizes; the row counts and the
    digests are checked where the shards are opened, `SplitRows` and
    seq2seq.data.datamodule.load_split, with `check_rows` and `check_digests`)."""
    try:
        meta = json.loads((folder / "meta.json").read_text())
        rows, shards = int(meta["rows"]), list(meta["shards"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise DamagedSplit(folder, f"meta.json unreadable: {type(err).__name__}") from None
    sizes = meta.get("shard_bytes")  # absent in caches written before it was recorded
    for i, name in enumerate(shards):
        try:
            size = (folder / name).stat().st_size
        except OSError:
            raise DamagedSplit(folder, f"{name} is missing") from None
        if sizes is not None and size != sizes[i]:
            raise DamagedSplit(folder, f"{name} has {size:,} bytes, meta.json says {sizes[i]:,}")
    if rows < 0:
        raise DamagedSplit(folder, f"meta.json says {rows} rows")
    return meta


def checked_meta(folder: Path) -> dict[str, Any]:
    """A split's meta.json, its shards checked against it whole (`read_meta`, then
    `check_digests`): what preparation takes as a complete split; anything else is a DamagedSplit,
    rebuilt under the cache's lock."""
    meta = read_meta(folder)
    check_digests(folder, meta)
    return meta


def shard_digest(path: Path) -> str:
    """The SHA-256 of a shard file, as meta.json records it (`shard_sha256`)."""
    with open(path, "rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


def check_digests(folder: Path, meta: dict[str, Any]) -> None:
    """Refuse a split whose shards are not the bytes written (a flipped block keeps the size, and
    its ids, up to 65,535 with a vocabulary of 100, would reach the embedding as data). Caches
    written before the digests were recorded are read unchecked."""
    digests = meta.get("shard_sha256")
    if digests is None:
        return
    for name, expected in zip(meta["shards"], digests, strict=True):
        if shard_digest(folder / name) != expected:
            raise DamagedSplit(folder, f"{name} does not match its SHA-256 in meta.json")


def check_rows(folder: Path, meta: dict[str, Any], found: int) -> None:
    """Refuse a split whose shards hold another number of rows than its meta.json says."""
    if found != meta["rows"]:
        raise DamagedSplit(folder, f"{found:,} rows in its shards, meta.json says {meta['rows']:,}")


def write_reason(err: OSError) -> str:
    """The system's words for a failed write; Arrow's errors carry the errno only in their text."""
    if err.errno:
        return os.strerror(err.errno)
    found = re.search(r"\[errno (\d+)\]", str(err))
    return os.strerror(int(found.group(1))) if found else str(err)


def fsynced(path: Path) -> int:
    """Flush `path` to the disk; its size in bytes."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


def next_shard(writer: Any, folder: Path, shards: list[str], schema: pa.Schema) -> Any:
    """Close `writer` (if any) and open the next shard file in `folder`; its name joins `shards`."""
    if writer is not None:
        writer.close()
    shards.append(f"shard-{len(shards):05d}.arrow")
    return pa.ipc.new_stream(str(folder / shards[-1]), schema)


def split_schema(dtype: type, text: bool, links: bool = False) -> pa.Schema:
    ids, fields = pa.list_(pa.from_numpy_dtype(dtype)), [("index", pa.uint32())]
    for side in ("src", "tgt"):
        fields += [(f"{side}_len", pa.uint16()), (f"{side}_ids", ids)]
    fields += [("links", pa.list_(pa.uint16()))] * links
    return pa.schema(fields + [("src", pa.string()), ("tgt", pa.string())] * text)


def record_batch(
    chunk: Pairs, ids: tuple[np.ndarray, ...], first: int, schema: pa.Schema
) -> pa.RecordBatch:
    """One chunk's rows; `first` is the row number (`index`) of its first pair in the split."""
    columns = [pa.array(np.arange(first, first + len(chunk), dtype=np.uint32))]
    for lens, flat in (ids[:2], ids[2:4]):  # source, then target: lengths (B,), ids (sum of lens,)
        offsets = np.zeros(len(lens) + 1, np.int32)  # (B + 1,)
        np.cumsum(lens, out=offsets[1:])
        columns.append(pa.array(np.minimum(lens, 2**16 - 1).astype(np.uint16)))
        columns.append(pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat)))
    if "links" in schema.names:  # links per pair (B,), interleaved piece indices (2 x links,)
        offsets = np.zeros(len(ids[4]) + 1, np.int32)  # (B + 1,)
        np.cumsum(2 * ids[4], out=offsets[1:])
        columns.append(pa.ListArray.from_arrays(pa.array(offsets), pa.array(ids[5])))
    if "src" in schema.names:
        columns += [pa.array(chunk.src, pa.string()), pa.array(chunk.tgt, pa.string())]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


class SplitRows(Dataset):
    """Rows of a prepared split read with `os.pread`: {"src_ids", "tgt_ids", "index"} per row, and
    "links" (seq2seq.data.links) when the split has them.

    A memory-mapped table would serve them too, but each page fault maps 64 KB around the row, so
    the resident set of a training run would grow towards the size of the cache; read this way it
    stays flat (the kernel's page cache holds what was read). Kept in memory: the file offsets of
    each record batch's buffers, found once through a mapping that is closed again.
    """

    # (column, buffer) of each record batch: the lengths; then the list offsets and values of ids
    COLUMNS = [("src_len", 1), ("tgt_len", 1)] + [
        (f"{s}_ids", i) for s in ("src", "tgt") for i in (1, 3)
    ]

    def __init__(self, path: Path) -> None:
        from seq2seq.data.shards import check_rows, checked_meta

        meta = checked_meta(path)  # a shard whose bytes changed in place is not read as ids
        shards = meta["shards"]
        self.files, self._fds = [str(path / name) for name in shards], {}
        firsts, where = [0], []  # first row of each record batch; its shard and buffer offsets
        self.columns = list(self.COLUMNS)
        for shard, file in enumerate(self.files):
            whole = pa.memory_map(file).read_buffer()  # zero-copy: address - base = file offset
            if shard == 0 and "links" in pa.ipc.open_stream(whole).schema.names:
                self.columns += [("links", 1), ("links", 3)]  # offsets, values (uint16)
            for batch in filter(len, pa.ipc.open_stream(whole)):  # (a chunk of blank pairs: none)
                buffers = [batch.column(c).buffers()[i] for c, i in self.columns]
                # (a list column whose lists are all empty may have no values buffer: never read)
                where.append([shard, *(b.address - whole.address if b else 0 for b in buffers)])
                firsts.append(firsts[-1] + batch.num_rows)
                value_type = batch.schema.field("src_ids").type.value_type
        self.dtype = np.dtype(value_type.to_pandas_dtype()) if where else np.dtype(np.uint16)
        self.firsts = np.array(firsts)  # (batches + 1,)
        self.where = np.array(where, np.int64).reshape(-1, 1 + len(self.columns))  # (batches, 7|9)
        check_rows(path, meta, int(self.firsts[-1]))  # a shard cut at a record batch reads short

    def __len__(self) -> int:
        return int(self.firsts[-1])

    def lengths(self) -> tuple[np.ndarray, np.ndarray]:
        """Subwords of each source and target sentence, (N,) uint16 each (saturating)."""
        sides = np.zeros((2, len(self)), np.uint16)  # (2, N)
        for b, (shard, *at) in enumerate(self.where.tolist()):
            first, end = self.firsts[b : b + 2].tolist()
            for side, offset in zip(sides, at[:2], strict=True):
                side[first:end] = np.frombuffer(
                    os.pread(self._fd(shard), 2 * (end - first), offset), np.uint16
                )
        return sides[0], sides[1]

    def __getitems__(self, rows: list[int]) -> list[dict[str, Any]]:
        batches = np.searchsorted(self.firsts, rows, side="right") - 1  # (B,)
        items = []
        for row, b in zip(rows, batches.tolist(), strict=True):
            shard, _, _, *at = self.where[b].tolist()  # offsets, values of src; of tgt; of links
            fd, local, item = self._fd(shard), row - int(self.firsts[b]), {"index": row}
            lists = [("src_ids", *at[:2], self.dtype), ("tgt_ids", *at[2:4], self.dtype)]
            lists += [("links", *at[4:], np.dtype(np.uint16))] if at[4:] else []
            for side, offsets, values, dtype in lists:
                start, end = np.frombuffer(os.pread(fd, 8, offsets + 4 * local), np.int32).tolist()
                raw = os.pread(fd, (end - start) * dtype.itemsize, values + start * dtype.itemsize)
                item[side] = np.frombuffer(raw, dtype).tolist()
            items.append(item)
        return items

    def __getitem__(self, row: int) -> dict[str, Any]:
        return self.__getitems__([row])[0]

    def _fd(self, shard: int) -> int:
        if shard not in self._fds:  # opened lazily, so that a spawned loader worker opens its own
            self._fds[shard] = os.open(self.files[shard], os.O_RDONLY)
        return self._fds[shard]

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_fds": {}}

    def __del__(self, close: Any = os.close) -> None:  # bound now: `os` may be gone at exit
        for fd in getattr(self, "_fds", {}).values():
            close(fd)
