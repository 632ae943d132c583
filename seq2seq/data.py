"""The training data: the prepared cache (seq2seq.prepare) as datasets and token-budget loaders.

Batches themselves (token budget, padding, masks) are seq2seq.batching's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader

from seq2seq.batching import TokenBudgetBatchSampler, collate, source_loader
from seq2seq.config import TrainConfig
from seq2seq.errors import UserError
from seq2seq.prepare import prepare
from seq2seq.tokenizer import Tokenizer

__all__ = [
    "TokenBudgetBatchSampler",
    "TranslationDataModule",
    "collate",
    "load_split",
    "source_loader",
]


def load_split(path: Path) -> Any:
    """A prepared split folder as one memory-mapped `datasets.Dataset`: nothing is read into RAM."""
    import datasets  # after lightning: its import is slow, and only needed here

    shards = json.loads((path / "meta.json").read_text())["shards"]
    parts = [datasets.Dataset.from_file(str(path / name)) for name in shards]
    return parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)


class TranslationDataModule(L.LightningDataModule):
    """Prepared corpus -> memory-mapped Arrow datasets -> token-budget batches.

    `prepare_data` builds the cache when it is cold (one process per cache; the others wait) and
    may be called from every process. After `setup`: `tokenizer`, `vocab_size`, `datasets`
    ("train"/"val"/"test" -> `datasets.Dataset` with columns index, src_ids, tgt_ids, src_len,
    tgt_len, and src, tgt for all but train), `split_names` (the corpus's own names for them) and
    `counts` (pairs dropped as empty or longer than `max_len` subwords).
    """

    def __init__(self, cfg: TrainConfig, test_split: str | None = None) -> None:
        """Args: cfg: the run's config; the data settings (dataset, data_dir, src, tgt, vocab_size,
        spm_model, spm_sample, limit_train_pairs, batch_tokens, max_len, cache_dir,
        prepare_workers, seed, num_workers) are read from it.
        test_split: the split `test` names (default: test_2016_flickr or test, when present)."""
        super().__init__()
        self.cfg, self.test_split = cfg, test_split
        self.tokenizer: Tokenizer | None = None
        self.vocab_size: int | None = None
        self.datasets: dict[str, Any] = {}
        self.split_names: dict[str, str] = {}
        self.counts: dict[str, int] = {}
        self._resume_at: tuple[int, int] | None = None  # (epoch, batches done) from a checkpoint

    def prepare_data(self) -> None:
        prepare(self.cfg, self.test_split)  # no state here: Lightning calls it on one rank only

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return  # fit then test calls setup twice; the data does not change
        prepared = prepare(self.cfg, self.test_split)  # reads the cache, builds it when cold
        self.tokenizer, self.split_names = prepared.tokenizer, prepared.split_names
        self.vocab_size = self.tokenizer.vocab_size
        for name, path in prepared.paths.items():
            self.datasets[name] = load_split(path)
            self.counts[f"{name}/empty"] = prepared.meta[name]["empty"]
        self.counts["train/too_long"] = int((self._cost("train") > self.cfg.max_len + 1).sum())
        sizes = ", ".join(f"{k} {len(v)}" for k, v in self.datasets.items())
        drops = ", ".join(f"{k} {v}" for k, v in self.counts.items() if v)
        rank_zero_info(
            f"{prepared.location}: {sizes} pairs, vocab {self.vocab_size}; dropped: "
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
        """Raw target sentences of `split` ("val", "test"; train keeps none) in `index` order."""
        return self._text(split, "tgt")

    def sources(self, split: str) -> list[str]:
        """Raw source sentences of `split` ("val", "test"; train keeps none) in `index` order."""
        return self._text(split, "src")

    def _text(self, split: str, side: str) -> list[str]:
        data = self._dataset(split)
        if side not in data.column_names:
            raise UserError(f"the prepared {split!r} split keeps no raw text (only ids)")
        return data.data.column(side).to_pylist()

    def _dataset(self, split: str) -> Any:
        if not self.datasets:
            raise RuntimeError("call setup() first")
        # The corpus's own names work too ("test_2016_flickr", "validation").
        split = {real: name for name, real in self.split_names.items()}.get(split, split)
        if split not in self.datasets:
            raise UserError(f"no split {split!r} loaded (have: {', '.join(self.datasets)})")
        return self.datasets[split]

    def _cost(self, split: str) -> np.ndarray:
        """Padded cost of each pair (N,): its longer side plus EOS (source) or BOS (target)."""
        table = self._dataset(split).data  # Arrow columns, read without Python objects
        src, tgt = (table.column(k).to_numpy() for k in ("src_len", "tgt_len"))  # (N,) uint16
        return np.maximum(src, tgt).astype(np.int32) + 1  # (N,)

    def _loader(self, split: str, shuffle: bool) -> DataLoader:
        data = self._dataset(split).select_columns(["src_ids", "tgt_ids", "index"])
        cost, rows = self._cost(split), None
        if split == "train":
            rows = np.flatnonzero(cost <= self.cfg.max_len + 1).astype(np.int32)  # (N',)
            cost = cost[rows]  # (N',); the sampler yields dataset rows, `index` is the row
        epoch, replicas, rank = 0, 1, 0
        if self.trainer is not None:
            trainer = self.trainer
            epoch, replicas, rank = trainer.current_epoch, trainer.world_size, trainer.global_rank
        sampler = TokenBudgetBatchSampler(
            cost, self.cfg.batch_tokens, shuffle, self.cfg.seed, replicas, rank, rows
        )
        if shuffle and self._resume_at is not None:
            # A resumed run: the order of the epoch it stopped in (seed + epoch), minus the batches
            # already trained. Lightning builds this loader before it restores its own loop state.
            (epoch, sampler.skip), self._resume_at = self._resume_at, None
            sampler.set_epoch(epoch)
            if sampler.skip >= len(sampler):  # saved at the end of an epoch: the next one, whole
                epoch, sampler.skip = epoch + 1, 0
        sampler.set_epoch(epoch)  # Lightning sets it again at each epoch start
        return DataLoader(
            data, batch_sampler=sampler, collate_fn=collate, num_workers=self.cfg.num_workers
        )
