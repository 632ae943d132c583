"""Batches: token-budget bucketing, padding, masks.

A batch is a `dict[str, Tensor]`: `src` (B, S) ids + EOS; `src_lens` (B,); `src_mask` (B, S), True =
real token; `tgt_in` (B, T) BOS + ids; `tgt_out` (B, T) ids + EOS; `tgt_mask` (B, T); `index` (B,), the
row of each pair in its split. Padding is PAD = 0 everywhere. Source-only batches lack the `tgt_*` keys.
Items with word-alignment links (a guided run's training split) add `align_ref` (B, T, S): 1 where
target piece t is linked to source piece s (seq2seq.data.links); the EOS row and column stay 0.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import chain
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Sampler

from seq2seq.data.links import dense_reference
from seq2seq.data.tokenizer import BOS, EOS, PAD
from seq2seq.errors import UserError


class TokenBudgetBatchSampler(Sampler[list[int]]):
    """Length-bucketed batches with `len(batch) * max(lengths in batch) <= batch_tokens`.

    `lengths[i]` is the padded cost of example i (its longer side, EOS/BOS included); a single
    over-long example makes a batch of one, and a length of 0 leaves the example out (a pair over
    --max-len, say) while batches still yield the original indices. With `shuffle`, ties in length are broken and batches
    ordered by a generator seeded with `seed + epoch`; each rank takes every `num_replicas`-th batch
    and the remainder is dropped, so all ranks take the same number of steps, a multiple of
    `multiple_of` (the batches of one accumulated update). Without it, batches
    are length-sorted and every example lands on exactly one rank; batches are split (never
    repeated) to even the counts.

    An epoch's batches are built once, with numpy, and kept as arrays: the examples in batch order
    (N,) and this rank's batch bounds (2, M); an iterated batch becomes a list only when it is used.
    `lengths` keeps its integer type (uint16 halves the memory of int32 for a large corpus); the
    sort by length is a counting sort in chunks, so building needs no (N,) int64 array.
    """

    def __init__(
        self,
        lengths: Sequence[int] | np.ndarray,
        batch_tokens: int,
        shuffle: bool = False,
        seed: int = 1,
        num_replicas: int = 1,
        rank: int = 0,
        multiple_of: int = 1,
    ) -> None:
        if batch_tokens < 1:
            raise UserError(f"`batch_tokens` {batch_tokens} must be positive")
        self.lengths = np.asarray(lengths)  # (N,)
        if self.lengths.dtype.kind not in "iu":
            self.lengths = self.lengths.astype(np.int64)
        self.batch_tokens, self.shuffle, self.seed = batch_tokens, shuffle, seed
        self.num_replicas, self.rank, self.epoch = num_replicas, rank, 0
        self.multiple_of = multiple_of  # with shuffle: each rank's batch count is a multiple of it
        self.skip = 0  # batches to leave out of the next pass only (a run resumed mid-epoch)
        self._cache: tuple[int, np.ndarray, np.ndarray] | None = None  # (epoch, order, bounds)

    @property
    def sampler(self) -> TokenBudgetBatchSampler:
        # Lightning's fit loop calls `dataloader.batch_sampler.sampler.set_epoch(epoch)`.
        return self

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _batches(self) -> tuple[np.ndarray, np.ndarray]:
        """This epoch's examples in batch order (N,) and this rank's batches as bounds (2, M)."""
        if self._cache is None or self._cache[0] != self.epoch:
            self._cache = None  # the last epoch's arrays go before the new ones are made
            self._cache = (self.epoch, *self._build())
        return self._cache[1], self._cache[2]

    def _build(self) -> tuple[np.ndarray, np.ndarray]:
        n, replicas = len(self.lengths), self.num_replicas
        index = np.int32 if n < 2**31 else np.int64
        keys = self.lengths
        counts = np.bincount(keys) if keys.size else np.zeros(1, np.int64)  # (L,) examples a length
        if self.shuffle:
            gen = torch.Generator().manual_seed(self.seed + self.epoch)
            perm = torch.randperm(n, generator=gen, dtype=torch.int32).numpy()  # (N,)
            order = _sort_by_key(keys, counts, perm.astype(index, copy=False))  # random ties
        else:
            order = _sort_by_key(keys, counts, None, index)  # (N,) ties in corpus order
        order = order[counts[0] :]  # (N',) the left-out examples (length 0) sort first
        n, counts[0] = len(order), 0
        starts = _greedy_starts(counts, self.batch_tokens)  # (M,)
        bounds = np.stack([starts, np.append(starts[1:], n)[: len(starts)]])  # (2, M)
        if self.shuffle:
            bounds = bounds[:, torch.randperm(bounds.shape[1], generator=gen).numpy()]
            # Dropped batches differ every epoch; a corpus with too few batches is repeated. Each
            # rank gets a multiple of `multiple_of` batches (accumulation windows), so every epoch
            # ends on a whole update and updates fall on the same batch counts in every epoch.
            count, unit = bounds.shape[1], replicas * self.multiple_of
            keep = count - count % unit if count >= unit else unit
            bounds = np.tile(bounds, -(-keep // max(count, 1)))[:, :keep] if count else bounds
        while bounds.shape[1] % replicas and (bounds[1] - bounds[0]).max() > 1:
            j = int(np.argmax(bounds[1] - bounds[0]))  # the first largest batch
            half = bounds[0, j] + (bounds[1, j] - bounds[0, j]) // 2  # halving keeps the budget
            bounds = np.insert(bounds, j + 1, [half, bounds[1, j]], axis=1)  # (2, M + 1)
            bounds[1, j] = half
        return order, bounds[:, self.rank :: replicas]

    def __iter__(self) -> Iterator[list[int]]:
        # __len__ stays the full count: Lightning resumes its batch counter at the skipped ones.
        order, bounds = self._batches()
        skip, self.skip = self.skip, 0
        for k in range(skip, bounds.shape[1]):  # one batch at a time: no list of them all
            yield order[bounds[0, k] : bounds[1, k]].tolist()

    def __len__(self) -> int:
        return self._batches()[1].shape[1]


def _sort_by_key(
    keys: np.ndarray, counts: np.ndarray, items: np.ndarray | None, index: type = np.int32
) -> np.ndarray:
    """`items` (N,) (None: 0..N-1 as `index`) ordered by `keys[items]`, ties in their order in
    `items`: `items[np.argsort(keys[items], kind="stable")]`, without that (N,) int64 argsort. A
    counting sort (`counts` = np.bincount(keys)) in chunks: beyond the result, memory is O(chunk)."""
    n = len(keys)
    order = np.empty(n, items.dtype if items is not None else index)  # (N,)
    free = np.concatenate([[0], np.cumsum(counts)[:-1]])  # (L,) the next free slot of each key
    for start in range(0, n, _CHUNK):
        end = min(n, start + _CHUNK)
        chunk = items[start:end] if items is not None else np.arange(start, end, dtype=index)
        key = keys[chunk]  # (C,)
        by = np.argsort(key, kind="stable")  # (C,)
        sorted_key = key[by]  # (C,)
        rank = np.arange(len(by)) - np.searchsorted(sorted_key, sorted_key)  # (C,) within its key
        order[free[sorted_key] + rank] = chunk[by]
        free += np.bincount(key, minlength=len(free))
    return order


_CHUNK = 1 << 20  # examples sorted at a time by _sort_by_key


def _greedy_starts(counts: np.ndarray, budget: int) -> np.ndarray:
    """Where each batch starts among the examples sorted by length, `counts[L]` of length L (L > 0),
    when examples are added in order while (batch size + 1) * newcomer's length <= budget: the
    greedy fill, one numpy step per distinct length. Within a run of equal length L a batch holds
    at most budget // L examples (at least 1)."""
    starts, open_size, first = [], None, 0  # open_size: examples in the batch being filled
    for length in np.flatnonzero(counts).tolist():
        m, cap = int(counts[length]), budget // max(length, 1)
        join = 0 if open_size is None else max(0, min(m, cap - open_size))
        new = np.arange(first + join, first + m, max(cap, 1))  # the rest: fresh batches
        starts.append(new)
        open_size = first + m - int(new[-1]) if new.size else open_size + join
        first += m
    return np.concatenate(starts) if starts else np.zeros(0, np.int64)  # (M,)


def pad_batch(seqs: list[list[int]]) -> tuple[Tensor, Tensor, Tensor]:
    """Right-pad with PAD. Returns ids (B, L) long, lengths (B,) long, mask (B, L) bool."""
    lens = torch.tensor([len(s) for s in seqs], dtype=torch.long)  # (B,)
    mask = torch.arange(int(lens.max())) < lens[:, None]  # (B, L)
    ids = torch.full(mask.shape, PAD, dtype=torch.long)  # (B, L)
    # Boolean assignment fills row by row, the same order as the concatenated lists.
    ids[mask] = torch.tensor(list(chain.from_iterable(seqs)), dtype=torch.long)
    return ids, lens, mask


def collate(items: list[dict[str, Any]]) -> dict[str, Tensor]:
    """Items with `src_ids`, `index` and (unless source-only) `tgt_ids` to a padded batch.

    Pairs come in order of target length, longest first (stable), the order in which the GRU
    decoder's rows end: each step then runs on the rows still decoding as a view (`index` names them).
    """
    if "tgt_ids" in items[0]:
        items = sorted(items, key=lambda x: -len(x["tgt_ids"]))
    src, src_lens, src_mask = pad_batch([x["src_ids"] + [EOS] for x in items])  # (B, S)
    index = torch.tensor([x["index"] for x in items], dtype=torch.long)  # (B,)
    batch = {"src": src, "src_lens": src_lens, "src_mask": src_mask, "index": index}
    if "tgt_ids" in items[0]:
        tgt, _, mask = pad_batch([[BOS, *x["tgt_ids"], EOS] for x in items])  # (B, T + 1)
        batch["tgt_mask"] = mask[:, 1:]  # (B, T)
        batch["tgt_in"] = tgt[:, :-1].masked_fill(~batch["tgt_mask"], PAD)  # (B, T); no EOS
        batch["tgt_out"] = tgt[:, 1:]  # (B, T)
    if "links" in items[0]:  # a guided run's training pairs
        T = batch["tgt_out"].size(1)
        batch["align_ref"] = dense_reference(
            [x["links"] for x in items], T, src.size(1)
        )  # (B, T, S)
    return batch
