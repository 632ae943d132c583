"""The training data: the prepared cache (seq2seq.data.prepare) as datasets and token-budget loaders.

Batches themselves (token budget, padding, masks) are seq2seq.data.batching's.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader

from seq2seq.data.batching import TokenBudgetBatchSampler, collate
from seq2seq.data.config import DataConfig, order_fields
from seq2seq.data.prepare import prepare
from seq2seq.data.shards import SplitRows
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.errors import UserError


class LazySplits(Mapping):
    """Split name -> `datasets.Dataset` (memory-mapped Arrow), opened on first use: training
    reads through `SplitRows` and never maps the (large) training split."""

    def __init__(self, paths: dict[str, Path]) -> None:
        self.paths, self._open = paths, {}

    def __getitem__(self, split: str) -> Any:
        if split not in self._open:
            self._open[split] = load_split(self.paths[split])
        return self._open[split]

    def __iter__(self) -> Iterator[str]:
        return iter(self.paths)

    def __len__(self) -> int:
        return len(self.paths)


def load_split(path: Path) -> Any:
    """A prepared split folder as one memory-mapped `datasets.Dataset`, with the same columns."""
    import datasets  # after lightning: its import is slow, and only needed here

    from seq2seq.data.shards import check_digests, check_rows, read_meta

    meta = read_meta(path)
    check_digests(path, meta)  # a shard whose bytes changed in place is not read as ids
    parts = [datasets.Dataset.from_file(str(path / name)) for name in meta["shards"]]
    split = parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)
    check_rows(path, meta, len(split))  # a shard cut at a record batch reads short
    return split


class TranslationDataModule(L.LightningDataModule):
    """Prepared corpus (seq2seq.data.prepare) -> token-budget batches of rows read from its shards.

    `prepare_data` builds the cache when it is cold (one process per cache; the others wait) and
    may be called from every process. After `setup`: `tokenizer`, `vocab_size`, `datasets`
    ("train"/"val"/"test" -> `datasets.Dataset` with columns index, src_ids, tgt_ids, src_len,
    tgt_len, and src, tgt for all but train; opened when first used), `split_names` (the corpus's
    own names for them) and `counts` (pairs dropped as empty or longer than `max_len` subwords).
    """

    def __init__(
        self, cfg: DataConfig, test_split: str | None = None, positions: int | None = None
    ) -> None:
        """Args: cfg: the data settings (a TrainConfig holds them).
        test_split: the split `test` names (default: test_2016_flickr or test, when present).
        positions: the longest side (subwords, EOS or BOS not counted) the model can take; longer
            validation and test pairs are left out of their batches (None: no limit; the
            Transformer's: `ModelConfig.positions`)."""
        super().__init__()
        self.cfg, self.test_split, self.positions = cfg, test_split, positions
        self.tokenizer: Tokenizer | None = None
        self.vocab_size: int | None = None
        self.datasets: Mapping[str, Any] = {}
        self.split_names: dict[str, str] = {}
        self.counts: dict[str, int] = {}
        self._resume_at: tuple[int, int] | None = None  # (epoch, batches done) from a checkpoint
        self._rows: dict[str, SplitRows] = {}
        self.corpus_hash: str | None = None  # meta.json's SHA-1 of the training pairs

    def prepare_data(self) -> None:
        prepare(self.cfg, self.test_split)  # no state here: Lightning calls it on one rank only

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return  # fit then test calls setup twice; the data does not change
        prepared = prepare(self.cfg, self.test_split)  # reads the cache, builds it when cold
        self.tokenizer, self.split_names = prepared.tokenizer, prepared.split_names
        self.vocab_size = self.tokenizer.vocab_size
        self.datasets = LazySplits(prepared.paths)
        for name in set(prepared.paths) - {"train"}:
            self.datasets[name]  # small: opened now (and `datasets` imported), train when asked
        self._rows = {name: SplitRows(path) for name, path in prepared.paths.items()}
        self.corpus_hash = prepared.meta["train"].get("sha1")  # of the training pairs as read
        for name in prepared.paths:
            self.counts[f"{name}/empty"] = prepared.meta[name]["empty"]
        for name in prepared.paths:
            self.counts[f"{name}/too_long"] = int((self._cost(name) == 0).sum())
        sizes = ", ".join(f"{k} {len(v)}" for k, v in self._rows.items())
        drops = ", ".join(f"{k} {v}" for k, v in self.counts.items() if v)
        limits = f"longer than max_len, {self.cfg.max_len} subwords"
        if self.positions is not None:
            limits += f"; in val and test, over the model's {self.positions}"
        rank_zero_info(
            f"{prepared.location}: {sizes} pairs, vocab {self.vocab_size}; dropped: "
            f"{drops or 'none'} (too_long: {limits})"
        )
        self._refuse_degenerate(prepared.location)

    def _refuse_degenerate(self, location: str) -> None:
        """A training split with no pair to train on, or a validation split with none to score, is
        refused now: before, the first ended a run with exit 0 and no checkpoint, the second failed
        at fit start."""
        for role, what in (("train", "training"), ("val", "validation")):
            total = len(self._rows[role])
            if total - self.counts[f"{role}/too_long"] > 0:
                continue
            name = self.split_names[role]
            if total == 0:
                reason = "it has no pairs"
                if self.counts[f"{role}/empty"]:
                    reason += f" ({self.counts[f'{role}/empty']} blank lines dropped)"
            elif role == "train":
                reason = f"all {total} pairs are longer than `max_len` {self.cfg.max_len} subwords"
            else:
                reason = f"all {total} pairs are longer than the model's positions"
            raise UserError(f"{location}: the {what} split {name!r} yields no batch: {reason}")

    def state_dict(self) -> dict[str, int]:
        """Where training stands in its epoch; saved in checkpoints for a mid-epoch resume."""
        if self.trainer is None:
            return {}
        done = self.trainer.fit_loop.epoch_loop.batch_progress.current.completed
        order = order_settings(self.cfg, self.trainer.world_size)
        state = {"epoch": self.trainer.current_epoch, "batches_done": done, "order": order}
        return {**state, "corpus": self.corpus_hash}

    def load_state_dict(self, state: dict[str, Any]) -> None:
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
        """Padded cost of each pair (N,): its longer side plus EOS (source) or BOS (target); 0 for a
        pair that is left out: in train, longer than max_len; elsewhere, longer than the model's
        positions (uint16 in train: 2 bytes a pair)."""
        src, tgt = self._rows[split].lengths()  # (N,) uint16 each
        longer = np.maximum(src, tgt, out=src)  # (N,)
        kind = np.uint16 if split == "train" and self.cfg.max_len < 2**16 - 1 else np.int32
        cost = longer.astype(kind) + kind(1)  # (N,); a uint16 65,535 wraps to 0: left out anyway
        limit = self.cfg.max_len if split == "train" else self.positions
        if limit is not None:
            cost[longer > limit] = 0
        return cost

    def _loader(self, split: str, shuffle: bool) -> DataLoader:
        cost = self._cost(split)  # (N,)
        epoch, replicas, rank = 0, 1, 0
        if self.trainer is not None:
            trainer = self.trainer
            epoch, replicas, rank = trainer.current_epoch, trainer.world_size, trainer.global_rank
        whole = self.cfg.accumulate_grad_batches if shuffle else 1  # full windows every epoch
        sampler = TokenBudgetBatchSampler(
            cost, self.cfg.batch_tokens, shuffle, self.cfg.seed, replicas, rank, whole
        )
        if shuffle and self._resume_at is not None:
            # A resumed run: the order of the epoch it stopped in (seed + epoch), minus the batches
            # already trained. Lightning builds this loader before it restores its own loop state.
            (epoch, sampler.skip), self._resume_at = self._resume_at, None
            sampler.set_epoch(epoch)
            if sampler.skip >= len(sampler):  # saved at the end of an epoch: the next one, whole
                epoch, sampler.skip = epoch + 1, 0
        sampler.set_epoch(epoch)  # Lightning sets it again at each epoch start
        # A generator of its own: without one, each pass over the loader draws its workers' base
        # seed from torch's global generator, which dropout draws from, so a resumed run (which
        # starts its passes at other moments) would go on with other dropout masks.
        generator = torch.Generator().manual_seed(self.cfg.seed)
        return DataLoader(
            self._rows[split],
            batch_sampler=sampler,
            collate_fn=collate,
            num_workers=self.cfg.num_workers,
            generator=generator,
        )


def order_settings(cfg: DataConfig, world_size: int) -> dict[str, Any]:
    """What fixes the order of training batches (and so a resume's position in it)."""
    return {**{name: getattr(cfg, name) for name in order_fields()}, "processes": world_size}


def order_changes(cfg: DataConfig, world_size: int, checkpoint: dict) -> list[tuple[str, Any, Any]]:
    """(setting, value in `checkpoint`, value now) of each setting that fixes the batch order and
    differs; none for a checkpoint of an earlier version, which kept no order to compare with."""
    state = checkpoint.get(TranslationDataModule.__qualname__) or {}
    saved = state.get("order")
    if saved is None:
        return []
    now = order_settings(cfg, world_size)
    return [
        (name, saved[name], now[name]) for name in now if name in saved and saved[name] != now[name]
    ]


def changed_message(path: Path, changed: list[tuple[str, Any, Any]]) -> str:
    """`<path>: trained with `a` 1, `b` 2 (now 3, 4)`, each setting named as the library names it."""
    then = ", ".join(f"{_as_flag(name)} {before}" for name, before, _ in changed)
    here = ", ".join(str(after) for _, _, after in changed)
    return f"{path}: trained with {then} (now {here})"


def check_same_order(cfg: DataConfig, world_size: int, checkpoint: dict, path: Path) -> None:
    """Refuse to resume `checkpoint` with flags that change the batch order or the processes: its
    count of batches done would point into another order, and the schedule's horizon would move."""
    changed = order_changes(cfg, world_size, checkpoint)
    if changed:
        raise UserError(
            f"{changed_message(path, changed)}; resume with the same settings: they fix the order "
            "of training batches"
        )


def check_same_corpus(data: TranslationDataModule, checkpoint: dict, path: Path) -> None:
    """Refuse to resume `checkpoint` on other training pairs than it trained on (edited files, or
    another corpus under the same name): its count of batches done would point into other data."""
    state = checkpoint.get(TranslationDataModule.__qualname__) or {}
    saved, now = state.get("corpus"), data.corpus_hash
    if saved is not None and now is not None and saved != now:
        raise UserError(
            f"{path}: trained on other training pairs (SHA-1 {saved[:12]}, now {now[:12]}); "
            "resume on the corpus it trained on"
        )


def _as_flag(name: str) -> str:
    return "processes" if name == "processes" else f"`{name}`"
