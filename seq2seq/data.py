"""Batches for training and evaluation: token-budget bucketing, padding, masks.

A batch is a `dict[str, Tensor]`: `src` (B, S) ids + EOS; `src_lens` (B,); `src_mask` (B, S), True =
real token; `tgt_in` (B, T) BOS + ids; `tgt_out` (B, T) ids + EOS; `tgt_mask` (B, T); `index` (B,), the
row of each pair in its split. Padding is PAD = 0 everywhere. Source-only batches lack the `tgt_*` keys.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from itertools import chain
from pathlib import Path
from typing import Any

import datasets
import lightning as L
import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor
from torch.utils.data import DataLoader, Sampler

from seq2seq.corpus import CorpusSource, Pairs, read_pairs, resolve_corpus
from seq2seq.errors import UserError
from seq2seq.tokenizer import BOS, EOS, PAD, Tokenizer, load_or_train_tokenizer


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


class TranslationDataModule(L.LightningDataModule):
    """Corpus -> joint tokenizer -> cached, tokenized Arrow datasets -> token-budget batches.

    After `setup`: `tokenizer`, `vocab_size`, `datasets` ("train"/"val"/"test" -> `datasets.Dataset`
    with columns src, tgt, index, src_ids, tgt_ids, src_len, tgt_len), `split_names` (the corpus's
    own names for them) and `counts` (pairs dropped as empty or longer than `max_len` subwords).
    """

    def __init__(
        self,
        corpus: str = "multi30k",
        data_dir: str | None = None,
        src_lang: str = "de",
        tgt_lang: str = "en",
        vocab_size: int = 8000,
        limit_train_pairs: int | None = None,
        batch_tokens: int = 4096,
        max_len: int = 128,
        cache_dir: str = "data/cache",
        seed: int = 1,
        num_workers: int = 0,
        test_split: str | None = None,
    ) -> None:
        super().__init__()
        self.corpus, self.data_dir = corpus, data_dir
        self.src_lang, self.tgt_lang = src_lang, tgt_lang
        self.spm_size, self.limit_train_pairs = vocab_size, limit_train_pairs
        self.batch_tokens, self.max_len = batch_tokens, max_len
        self.cache_dir, self.seed, self.num_workers = Path(cache_dir), seed, num_workers
        self.test_split = test_split
        self.tokenizer: Tokenizer | None = None
        self.vocab_size: int | None = None
        self.datasets: dict[str, datasets.Dataset] = {}
        self.split_names: dict[str, str] = {}
        self.counts: dict[str, int] = {}
        self._resume_at: tuple[int, int] | None = None  # (epoch, batches done) from a checkpoint

    def prepare_data(self) -> None:
        source = resolve_corpus(self.corpus, self.data_dir)
        tokenizer = self._load_tokenizer(source)
        for split in self._split_names(source).values():
            self._encoded(source, tokenizer, split)  # fills the cache that setup reads on each rank

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return  # fit then test calls setup twice; the data does not change
        source = resolve_corpus(self.corpus, self.data_dir)
        self.tokenizer = self._load_tokenizer(source)
        self.vocab_size = self.tokenizer.vocab_size
        self.split_names = self._split_names(source)
        for name, split in self.split_names.items():
            self.datasets[name], self.counts[f"{name}/empty"] = self._encoded(
                source, self.tokenizer, split
            )
        self.counts["train/too_long"] = int((self._costs("train") > self.max_len + 1).sum())
        sizes = ", ".join(f"{k} {len(v)}" for k, v in self.datasets.items())
        drops = ", ".join(f"{k} {v}" for k, v in self.counts.items() if v)
        rank_zero_info(
            f"{source.location}: {sizes} pairs, vocab {self.vocab_size}; dropped: "
            f"{drops or 'none'} (too_long = over --max-len {self.max_len} subwords)"
        )

    def state_dict(self) -> dict[str, int]:
        """Where training stands in its epoch; saved in checkpoints for a mid-epoch resume."""
        if self.trainer is None:
            return {}
        done = self.trainer.fit_loop.epoch_loop.batch_progress.current.completed
        return {"epoch": self.trainer.current_epoch, "batches_done": done}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state:
            self._resume_at = (state["epoch"], state["batches_done"])

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", shuffle=False)

    def references(self, split: str) -> list[str]:
        """Raw target sentences of `split` ("train", "val", "test") in `index` order."""
        return list(self._dataset(split)["tgt"][:])

    def sources(self, split: str) -> list[str]:
        """Raw source sentences of `split` in `index` order."""
        return list(self._dataset(split)["src"][:])

    def _dataset(self, split: str) -> datasets.Dataset:
        if not self.datasets:
            raise RuntimeError("call setup() first")
        # The corpus's own names work too ("test_2016_flickr", "validation").
        split = {real: name for name, real in self.split_names.items()}.get(split, split)
        if split not in self.datasets:
            raise UserError(f"no split {split!r} loaded (have: {', '.join(self.datasets)})")
        return self.datasets[split]

    def _costs(self, split: str) -> np.ndarray:
        """Padded cost of each pair: its longer side plus EOS (source) or BOS (target)."""
        data = self._dataset(split)
        return np.maximum(np.asarray(data["src_len"][:]), np.asarray(data["tgt_len"][:])) + 1

    def _loader(self, split: str, shuffle: bool) -> DataLoader:
        data = self._dataset(split).select_columns(["src_ids", "tgt_ids", "index"])
        cost = self._costs(split)
        if split == "train":
            rows = np.flatnonzero(cost <= self.max_len + 1)
            data, cost = data.select(rows), cost[rows]  # `index` still names the original row
        epoch, replicas, rank = 0, 1, 0
        if self.trainer is not None:
            trainer = self.trainer
            epoch, replicas, rank = trainer.current_epoch, trainer.world_size, trainer.global_rank
        sampler = TokenBudgetBatchSampler(
            cost, self.batch_tokens, shuffle, self.seed, replicas, rank
        )
        if shuffle and self._resume_at is not None:
            # A resumed run: the order of the epoch it stopped in (seed + epoch), minus the batches
            # already trained. Lightning builds this loader before it restores its own loop state.
            (epoch, sampler.skip), self._resume_at = self._resume_at, None
            if sampler.skip >= len(
                sampler
            ):  # saved at the end of an epoch: start the next one whole
                epoch, sampler.skip = epoch + 1, 0
        sampler.set_epoch(epoch)  # Lightning sets it again at each epoch start
        return DataLoader(
            data, batch_sampler=sampler, collate_fn=collate, num_workers=self.num_workers
        )

    def _split_names(self, source: CorpusSource) -> dict[str, str]:
        names = {"train": source.find_split("train"), "val": source.find_split("val")}
        present = [s for s in ("test_2016_flickr", "test") if s in source.splits()]
        if self.test_split or present:
            names["test"] = source.find_split(self.test_split or present[0])
        return names

    def _load_tokenizer(self, source: CorpusSource) -> Tokenizer:
        langs = sorted((self.src_lang, self.tgt_lang))  # the joint model serves both directions
        fingerprint = source.fingerprint(source.find_split("train"), tuple(langs))
        key = f"{source.name}-{'-'.join(langs)}-{self.limit_train_pairs or 'all'}-{fingerprint}"

        def texts() -> Iterator[str]:
            pairs = read_pairs(source, "train", *langs, limit=self.limit_train_pairs)
            return chain(pairs.src, pairs.tgt)

        return load_or_train_tokenizer(self.cache_dir, texts, self.spm_size, _safe(key))

    def _encoded(
        self, source: CorpusSource, tokenizer: Tokenizer, split: str
    ) -> tuple[datasets.Dataset, int]:
        """A tokenized split and its count of empty pairs, from the cache or built into it."""
        limit = self.limit_train_pairs if split == source.find_split("train") else None
        langs = (self.src_lang, self.tgt_lang)
        model = hashlib.sha1(tokenizer.to_bytes()).hexdigest()[:8]
        key = f"{source.name}-{'-'.join(langs)}-{split}-{limit or 'all'}"
        key += f"-{source.fingerprint(split, langs)}-{model}"
        path = self.cache_dir / "encoded" / _safe(key)
        if not path.exists():
            _save_encoded(read_pairs(source, split, *langs, limit=limit), tokenizer, path)
        empty = json.loads((path / "pairs.json").read_text())["empty"]
        return datasets.load_from_disk(str(path)), empty


def _save_encoded(pairs: Pairs, tokenizer: Tokenizer, path: Path) -> None:
    """Tokenize with `Dataset.map` and save to `path` atomically (temporary folder, rename)."""

    def encode(batch: dict[str, list]) -> dict[str, list]:
        src, tgt = tokenizer.encode_batch(batch["src"]), tokenizer.encode_batch(batch["tgt"])
        return {
            "src_ids": src,
            "tgt_ids": tgt,
            "src_len": [*map(len, src)],
            "tgt_len": [*map(len, tgt)],
        }

    rows = {"src": pairs.src, "tgt": pairs.tgt, "index": list(range(len(pairs)))}
    raw = datasets.Dataset.from_dict(rows)
    # In memory, with a given fingerprint: datasets neither hashes the closure nor writes its own
    # cache files. The folder saved below is the cache that the next run loads instead.
    encoded = raw.map(encode, batched=True, batch_size=2000, new_fingerprint=path.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}."))
    try:
        encoded.save_to_disk(str(tmp))
        (tmp / "pairs.json").write_text(json.dumps({"empty": pairs.empty}))
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache is shared like the data
        os.replace(tmp, path)  # a crash never leaves a half-written cache
    except OSError:
        if not path.exists():  # else another process got there first with the same content
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)
