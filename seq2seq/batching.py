"""Batches: token-budget bucketing, padding, masks.

A batch is a `dict[str, Tensor]`: `src` (B, S) ids + EOS; `src_lens` (B,); `src_mask` (B, S), True =
real token; `tgt_in` (B, T) BOS + ids; `tgt_out` (B, T) ids + EOS; `tgt_mask` (B, T); `index` (B,), the
row of each pair in its split. Padding is PAD = 0 everywhere. Source-only batches lack the `tgt_*` keys.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import chain
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Sampler

from seq2seq.errors import UserError
from seq2seq.tokenizer import BOS, EOS, PAD, Tokenizer


class TokenBudgetBatchSampler(Sampler[list[int]]):
    """Length-bucketed batches with `len(batch) * max(lengths in batch) <= batch_tokens`.

    `lengths[i]` is the padded cost of example i (its longer side, EOS/BOS included); a single
    over-long example makes a batch of one. With `shuffle`, ties in length are broken and batches
    ordered by a generator seeded with `seed + epoch`; each rank takes every `num_replicas`-th batch
    and the remainder is dropped, so all ranks take the same number of steps. Without it, batches
    are length-sorted and every example lands on exactly one rank; batches are split (never
    repeated) to even the counts.
    """

    def __init__(
        self,
        lengths: Sequence[int],
        batch_tokens: int,
        shuffle: bool = False,
        seed: int = 1,
        num_replicas: int = 1,
        rank: int = 0,
    ) -> None:
        if batch_tokens < 1:
            raise UserError(f"--batch-tokens {batch_tokens} must be positive")
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.batch_tokens, self.shuffle, self.seed = batch_tokens, shuffle, seed
        self.num_replicas, self.rank, self.epoch = num_replicas, rank, 0
        self.skip = 0  # batches to leave out of the next pass only (a run resumed mid-epoch)

    @property
    def sampler(self) -> TokenBudgetBatchSampler:
        # Lightning's fit loop calls `dataloader.batch_sampler.sampler.set_epoch(epoch)`.
        return self

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _batches(self) -> list[list[int]]:
        order = np.argsort(self.lengths, kind="stable")
        if self.shuffle:
            gen = torch.Generator().manual_seed(self.seed + self.epoch)
            perm = torch.randperm(len(self.lengths), generator=gen).numpy()
            order = perm[np.argsort(self.lengths[perm], kind="stable")]  # sorted, random ties
        lengths, batches = self.lengths.tolist(), []
        for i in order.tolist():  # ascending, so the newcomer is the longest in its batch
            if batches and (len(batches[-1]) + 1) * lengths[i] <= self.batch_tokens:
                batches[-1].append(i)
            else:
                batches.append([i])
        replicas = self.num_replicas
        if self.shuffle:
            batches = [batches[j] for j in torch.randperm(len(batches), generator=gen).tolist()]
            # Dropped batches differ every epoch; a corpus with too few batches is repeated.
            keep = len(batches) - len(batches) % replicas if len(batches) >= replicas else replicas
            batches = (batches * replicas)[:keep] if batches else []
        while len(batches) % replicas and max(map(len, batches)) > 1:
            j = max(range(len(batches)), key=lambda k: len(batches[k]))
            half = len(batches[j]) // 2  # halving keeps the budget and drops no example
            batches[j : j + 1] = [batches[j][:half], batches[j][half:]]
        return batches[self.rank :: replicas]

    def __iter__(self) -> Iterator[list[int]]:
        # __len__ stays the full count: Lightning resumes its batch counter at the skipped ones.
        batches, self.skip = self._batches()[self.skip :], 0
        return iter(batches)

    def __len__(self) -> int:
        return len(self._batches())


def pad_batch(seqs: list[list[int]]) -> tuple[Tensor, Tensor, Tensor]:
    """Right-pad with PAD. Returns ids (B, L) long, lengths (B,) long, mask (B, L) bool."""
    lens = torch.tensor([len(s) for s in seqs], dtype=torch.long)  # (B,)
    mask = torch.arange(int(lens.max())) < lens[:, None]  # (B, L)
    ids = torch.full(mask.shape, PAD, dtype=torch.long)  # (B, L)
    # Boolean assignment fills row by row, the same order as the concatenated lists.
    ids[mask] = torch.tensor(list(chain.from_iterable(seqs)), dtype=torch.long)
    return ids, lens, mask


def collate(items: list[dict[str, Any]]) -> dict[str, Tensor]:
    """Items with `src_ids`, `index` and (unless source-only) `tgt_ids` to a padded batch."""
    src, src_lens, src_mask = pad_batch([x["src_ids"] + [EOS] for x in items])  # (B, S)
    index = torch.tensor([x["index"] for x in items], dtype=torch.long)  # (B,)
    batch = {"src": src, "src_lens": src_lens, "src_mask": src_mask, "index": index}
    if "tgt_ids" in items[0]:
        tgt, _, mask = pad_batch([[BOS, *x["tgt_ids"], EOS] for x in items])  # (B, T + 1)
        batch["tgt_mask"] = mask[:, 1:]  # (B, T)
        batch["tgt_in"] = tgt[:, :-1].masked_fill(~batch["tgt_mask"], PAD)  # (B, T); no EOS
        batch["tgt_out"] = tgt[:, 1:]  # (B, T)
    return batch


def source_loader(
    tokenizer: Tokenizer, sentences: list[str], batch_tokens: int, batch_size: int | None = None
) -> DataLoader:
    """Length-sorted batches of raw `sentences` for evaluate/translate; `index` is the position.

    Batches hold `batch_tokens` padded tokens, or `batch_size` sentences when that is given.
    """
    ids = tokenizer.encode_batch(list(sentences)) if sentences else []
    items = [{"src_ids": s, "index": i} for i, s in enumerate(ids)]
    if batch_size is None:
        batches = TokenBudgetBatchSampler([len(s) + 1 for s in ids], batch_tokens)
    else:
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))  # similar lengths pad least
        batches = [order[k : k + batch_size] for k in range(0, len(order), batch_size)]
    return DataLoader(items, batch_sampler=batches, collate_fn=collate)
