import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from lightning.fabric.utilities.data import _set_sampler_epoch

from seq2seq.data import batching
from seq2seq.data.datamodule import TokenBudgetBatchSampler, TranslationDataModule, collate
from seq2seq.data.tokenizer import BOS, EOS, PAD
from seq2seq.errors import UserError
from seq2seq.training.config import TrainConfig

BUDGET = 64


def _module(corpus: Path, cache: Path, **settings: object) -> TranslationDataModule:
    test_split = settings.pop("test_split", None)
    cfg = TrainConfig(data_dir=str(corpus), cache_dir=str(cache), **{"vocab_size": 100, **settings})
    module = TranslationDataModule(cfg, test_split=test_split)
    module.prepare_data()
    module.setup("fit")
    return module


@pytest.fixture(scope="module")
def dm(tiny_corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> TranslationDataModule:
    return _module(tiny_corpus, tmp_path_factory.mktemp("cache"), batch_tokens=BUDGET)


def _check_batch(batch: dict[str, torch.Tensor], budget: int) -> None:
    src_lens, tgt_lens = batch["src_lens"], batch["tgt_mask"].sum(1)
    assert batch["src_mask"].sum(1).tolist() == src_lens.tolist()
    assert len(src_lens) * max(batch["src"].shape[1], batch["tgt_out"].shape[1]) <= budget
    assert (batch["src"][~batch["src_mask"]] == PAD).all()
    assert (batch["tgt_out"][~batch["tgt_mask"]] == PAD).all()
    rows = torch.arange(len(src_lens))
    assert (batch["src"][rows, src_lens - 1] == EOS).all()
    assert (batch["tgt_out"][rows, tgt_lens - 1] == EOS).all()
    assert (batch["tgt_in"][:, 0] == BOS).all()
    assert (tgt_lens[:-1] >= tgt_lens[1:]).all()  # longest target first: the decoder's row order
    mask = batch["tgt_mask"][:, 1:]  # teacher forcing: the input is the output shifted right
    assert torch.equal(batch["tgt_in"][:, 1:] * mask, batch["tgt_out"][:, :-1] * mask)


def test_collate_pads_with_zero_and_masks_match_lengths() -> None:
    items = [
        {"src_ids": [5, 6, 7], "tgt_ids": [8], "index": 4},
        {"src_ids": [9], "tgt_ids": [10, 11, 12], "index": 0},
    ]
    batch = collate(items)  # longest target first: the second pair leads
    assert batch["src"].tolist() == [[9, EOS, PAD, PAD], [5, 6, 7, EOS]]
    assert batch["tgt_in"].tolist() == [[BOS, 10, 11, 12], [BOS, 8, PAD, PAD]]
    assert batch["tgt_out"].tolist() == [[10, 11, 12, EOS], [8, EOS, PAD, PAD]]
    assert batch["src_lens"].tolist() == [2, 4] and batch["index"].tolist() == [0, 4]
    assert batch["src_mask"].dtype == torch.bool and batch["src"].dtype == torch.long
    _check_batch(batch, budget=8)


def test_train_batches_respect_budget_and_cover_the_split(dm: TranslationDataModule) -> None:
    seen = []
    for batch in dm.train_dataloader():
        _check_batch(batch, BUDGET)
        seen += batch["index"].tolist()
    assert sorted(seen) == list(range(200))


def _greedy(lengths: list[int], budget: int) -> list[list[int]]:
    """The rule, plainly: in stable length order, join the last batch while (size + 1) * length fits."""
    batches: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lengths.__getitem__):
        if batches and (len(batches[-1]) + 1) * lengths[i] <= budget:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


@pytest.mark.parametrize("seed", range(5))
def test_vectorised_batches_equal_the_plain_greedy_rule(seed: int) -> None:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 40, int(rng.integers(1, 300))).tolist()
    lengths[0] = 90  # over the budget: a batch of one
    assert list(TokenBudgetBatchSampler(lengths, 60)) == _greedy(lengths, 60)
    shuffled = list(TokenBudgetBatchSampler(lengths, 60, shuffle=True, seed=seed))
    assert sorted(map(len, shuffled)) == sorted(map(len, _greedy(lengths, 60)))  # ties shuffled
    assert sorted(i for b in shuffled for i in b) == list(range(len(lengths)))  # each once


@pytest.mark.parametrize("chunk", [1, 7, 1 << 20])
def test_chunked_counting_sort_equals_a_stable_argsort(
    chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(batching, "_CHUNK", chunk)
    rng = np.random.default_rng(chunk)
    keys = rng.integers(0, 30, 1000).astype(np.uint16)  # many ties: their order is what can break
    items = rng.permutation(1000).astype(np.int32)
    counts = np.bincount(keys)
    got = batching._sort_by_key(keys, counts, items)
    assert got.tolist() == items[np.argsort(keys[items], kind="stable")].tolist()
    assert got.dtype == np.int32
    plain = batching._sort_by_key(keys, counts, None)
    assert plain.tolist() == np.argsort(keys, kind="stable").tolist()


def test_epoch_is_built_once_into_arrays(monkeypatch: pytest.MonkeyPatch) -> None:
    sampler, builds = TokenBudgetBatchSampler(np.arange(1, 500) % 17 + 1, 40, True), []
    real = sampler._build
    monkeypatch.setattr(sampler, "_build", lambda: builds.append(1) or real())
    for _ in range(3):
        assert len(sampler) == len(list(sampler))
    order, bounds = sampler._batches()
    assert isinstance(order, np.ndarray) and isinstance(bounds, np.ndarray) and len(builds) == 1
    sampler.set_epoch(1)
    assert len(sampler) and len(builds) == 2


def test_shuffle_is_seeded_per_epoch() -> None:
    lengths = [i % 13 + 1 for i in range(300)]
    samplers = [TokenBudgetBatchSampler(lengths, 40, shuffle=True, seed=s) for s in (1, 1, 1, 2)]
    samplers[2].set_epoch(1)
    same, again, next_epoch, other_seed = map(list, samplers)
    assert same == again and same != next_epoch and same != other_seed
    assert sorted(i for batch in next_epoch for i in batch) == list(range(300))


def test_lightning_sets_the_epoch(dm: TranslationDataModule) -> None:
    loader = dm.train_dataloader()
    _set_sampler_epoch(loader, 3)  # what the fit loop calls at each epoch start
    assert loader.batch_sampler.epoch == 3


def test_ranks_get_equal_counts_and_disjoint_shares(
    dm: TranslationDataModule, monkeypatch: pytest.MonkeyPatch
) -> None:
    lengths = [i % 7 + 1 for i in range(101)]
    for replicas in (2, 3):
        train = [list(TokenBudgetBatchSampler(lengths, 20, True, 1, replicas, r)) for r in range(3)]
        assert len({len(t) for t in train[:replicas]}) == 1
        shares = [{i for b in t for i in b} for t in train[:replicas]]
        assert not shares[0] & shares[1]
    counts = [len(TokenBudgetBatchSampler([5] * 9, 15, num_replicas=2, rank=r)) for r in (0, 1)]
    assert counts[0] == counts[1]
    for split in ("val", "test"):
        indices, batches = [], []
        for rank in (0, 1):
            fake = SimpleNamespace(current_epoch=0, world_size=2, global_rank=rank)
            monkeypatch.setattr(dm, "trainer", fake)  # what Lightning reads under DDP
            loader = dm.val_dataloader() if split == "val" else dm.test_dataloader()
            indices.append([i for b in loader for i in b["index"].tolist()])
            batches.append(len(loader))
        assert batches[0] == batches[1]  # equal steps, yet no example repeated
        assert sorted(indices[0] + indices[1]) == list(range(20))


def test_references_follow_index(dm: TranslationDataModule, tiny_corpus: Path) -> None:
    assert dm.references("test") == (tiny_corpus / "test.en").read_text("utf-8").splitlines()
    assert dm.sources("val") == (tiny_corpus / "val.de").read_text("utf-8").splitlines()
    refs = dm.references("val")
    for batch in dm.val_dataloader():
        for row, index in zip(batch["tgt_out"].tolist(), batch["index"].tolist(), strict=True):
            assert dm.tokenizer.decode(row) == refs[index]
    with pytest.raises(UserError, match="keeps no raw text"):
        dm.sources("train")  # the training split is stored as ids only


def test_limit_and_max_len(tiny_corpus: Path, tmp_path: Path) -> None:
    module = _module(tiny_corpus, tmp_path, vocab_size=80, limit_train_pairs=50, max_len=12)
    first = (tiny_corpus / "train.de").read_text("utf-8").splitlines()[:50]
    assert module.tokenizer.encode_batch(first) == module.datasets["train"]["src_ids"][:]
    assert len(module.datasets["val"]) == 20 and module.counts["train/too_long"] > 0
    kept = list(module.train_dataloader())
    assert sum(len(b["index"]) for b in kept) == 50 - module.counts["train/too_long"]
    assert max(int(b["src_lens"].max()) for b in kept) <= 13


def test_empty_lines_counted(tmp_path: Path, tiny_corpus: Path) -> None:
    corpus = shutil.copytree(tiny_corpus, tmp_path / "corpus")
    for lang, first in [("de", "\n"), ("en", "A lone line\n")]:  # one pair, blank on one side
        path = corpus / f"train.{lang}"
        path.write_text(first + path.read_text("utf-8"), "utf-8")
    module = _module(corpus, tmp_path)
    assert module.counts["train/empty"] == 1 and len(module.datasets["train"]) == 200


def test_test_split_option(tiny_corpus: Path, tmp_path: Path) -> None:
    module = _module(tiny_corpus, tmp_path, test_split="val")
    assert module.split_names["test"] == "val" and module.sources("test") == module.sources("val")


@pytest.mark.parametrize("done", [0, 3, "all"])
def test_resumed_loader_skips_only_the_batches_already_trained(
    dm: TranslationDataModule, done: int | str
) -> None:
    full = list(dm.train_dataloader().batch_sampler)
    done = len(full) if done == "all" else done
    dm.load_state_dict({"epoch": 0, "batches_done": done})
    resumed = list(dm.train_dataloader().batch_sampler)
    if done < len(full):  # mid-epoch: the rest of the same epoch's order
        assert resumed == full[done:]
    else:  # saved at the end of the epoch: the next epoch, whole (not an empty pass)
        assert len(resumed) == len(full) and resumed != full
