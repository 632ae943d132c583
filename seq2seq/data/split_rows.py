"""`SplitRows`: the rows of a prepared split (seq2seq.data.prepare's Arrow shards), read one batch's rows at
a time with `os.pread`, so that training memory does not follow the size of the corpus."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from torch.utils.data import Dataset


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
