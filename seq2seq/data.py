"""The training data: corpus -> joint tokenizer -> cached, tokenized Arrow datasets -> batches.

Batches themselves (token budget, padding, masks) are seq2seq.batching's.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from itertools import chain
from pathlib import Path

import datasets
import lightning as L
import numpy as np
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader

from seq2seq.batching import TokenBudgetBatchSampler, collate
from seq2seq.config import TrainConfig
from seq2seq.corpus import CorpusSource, Pairs, read_pairs, resolve_corpus
from seq2seq.errors import UserError
from seq2seq.tokenizer import Tokenizer, load_or_train_tokenizer


class TranslationDataModule(L.LightningDataModule):
    """Corpus -> joint tokenizer -> cached, tokenized Arrow datasets -> token-budget batches.

    After `setup`: `tokenizer`, `vocab_size`, `datasets` ("train"/"val"/"test" -> `datasets.Dataset`
    with columns src, tgt, index, src_ids, tgt_ids, src_len, tgt_len), `split_names` (the corpus's
    own names for them) and `counts` (pairs dropped as empty or longer than `max_len` subwords).
    """

    def __init__(self, cfg: TrainConfig, test_split: str | None = None) -> None:
        """Args: cfg: the run's config; the data settings (dataset, data_dir, src, tgt, vocab_size,
        limit_train_pairs, batch_tokens, max_len, cache_dir, seed, num_workers) are read from it.
        test_split: the split `test` names (default: test_2016_flickr or test, when present)."""
        super().__init__()
        self.cfg, self.test_split = cfg, test_split
        self.tokenizer: Tokenizer | None = None
        self.vocab_size: int | None = None
        self.datasets: dict[str, datasets.Dataset] = {}
        self.split_names: dict[str, str] = {}
        self.counts: dict[str, int] = {}
        self._resume_at: tuple[int, int] | None = None  # (epoch, batches done) from a checkpoint

    def prepare_data(self) -> None:
        source = resolve_corpus(self.cfg.dataset, self.cfg.data_dir)
        tokenizer = self._load_tokenizer(source)
        for split in self._split_names(source).values():
            self._encoded(source, tokenizer, split)  # fills the cache that setup reads on each rank

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return  # fit then test calls setup twice; the data does not change
        source = resolve_corpus(self.cfg.dataset, self.cfg.data_dir)
        self.tokenizer = self._load_tokenizer(source)
        self.vocab_size = self.tokenizer.vocab_size
        self.split_names = self._split_names(source)
        for name, split in self.split_names.items():
            self.datasets[name], self.counts[f"{name}/empty"] = self._encoded(
                source, self.tokenizer, split
            )
        self.counts["train/too_long"] = int((self._costs("train") > self.cfg.max_len + 1).sum())
        sizes = ", ".join(f"{k} {len(v)}" for k, v in self.datasets.items())
        drops = ", ".join(f"{k} {v}" for k, v in self.counts.items() if v)
        rank_zero_info(
            f"{source.location}: {sizes} pairs, vocab {self.vocab_size}; dropped: "
            f"{drops or 'none'} (too_long = over --max-len {self.cfg.max_len} subwords)"
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
            rows = np.flatnonzero(cost <= self.cfg.max_len + 1)
            data, cost = data.select(rows), cost[rows]  # `index` still names the original row
        epoch, replicas, rank = 0, 1, 0
        if self.trainer is not None:
            trainer = self.trainer
            epoch, replicas, rank = trainer.current_epoch, trainer.world_size, trainer.global_rank
        sampler = TokenBudgetBatchSampler(
            cost, self.cfg.batch_tokens, shuffle, self.cfg.seed, replicas, rank
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
            data, batch_sampler=sampler, collate_fn=collate, num_workers=self.cfg.num_workers
        )

    def _split_names(self, source: CorpusSource) -> dict[str, str]:
        names = {"train": source.find_split("train"), "val": source.find_split("val")}
        try:
            names["test"] = source.find_split(self.test_split or "test")
        except UserError:
            if self.test_split:  # asked for by name: its absence is an error; else no test split
                raise
        return names

    def _load_tokenizer(self, source: CorpusSource) -> Tokenizer:
        langs = sorted((self.cfg.src, self.cfg.tgt))  # the joint model serves both directions
        fingerprint = source.fingerprint(source.find_split("train"), tuple(langs))
        key = f"{source.name}-{'-'.join(langs)}-{self.cfg.limit_train_pairs or 'all'}-{fingerprint}"

        def texts() -> Iterator[str]:
            pairs = read_pairs(source, "train", *langs, limit=self.cfg.limit_train_pairs)
            return chain(pairs.src, pairs.tgt)

        return load_or_train_tokenizer(
            Path(self.cfg.cache_dir), texts, self.cfg.vocab_size, _safe(key)
        )

    def _encoded(
        self, source: CorpusSource, tokenizer: Tokenizer, split: str
    ) -> tuple[datasets.Dataset, int]:
        """A tokenized split and its count of empty pairs, from the cache or built into it."""
        limit = self.cfg.limit_train_pairs if split == source.find_split("train") else None
        langs = (self.cfg.src, self.cfg.tgt)
        model = hashlib.sha1(tokenizer.to_bytes()).hexdigest()[:8]
        key = f"{source.name}-{'-'.join(langs)}-{split}-{limit or 'all'}"
        key += f"-{source.fingerprint(split, langs)}-{model}"
        path = Path(self.cfg.cache_dir) / "encoded" / _safe(key)
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
