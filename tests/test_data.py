import shutil
from pathlib import Path
from types import SimpleNamespace

import datasets
import pytest
import torch
from lightning.fabric.utilities.data import _set_sampler_epoch

from seq2seq.data import TokenBudgetBatchSampler, TranslationDataModule, collate, source_loader
from seq2seq.tokenizer import BOS, EOS, PAD, Tokenizer

BUDGET = 64


@pytest.fixture(scope="module")
def dm(tiny_corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> TranslationDataModule:
    cache = tmp_path_factory.mktemp("cache")
    module = TranslationDataModule(
        data_dir=str(tiny_corpus), vocab_size=100, batch_tokens=BUDGET, cache_dir=str(cache)
    )
    module.prepare_data()
    module.setup("fit")
    return module


def _check_batch(batch: dict[str, torch.Tensor], budget: int) -> None:
    src_lens, tgt_lens = batch["src_lens"], batch["tgt_mask"].sum(1)
    assert batch["src_mask"].sum(1).tolist() == src_lens.tolist()
    assert len(src_lens) * max(batch["src"].shape[1], batch["tgt_out"].shape[1]) <= budget
    assert (batch["src"][~batch["src_mask"]] == PAD).all()
    assert (batch["tgt_in"][~batch["tgt_mask"]] == PAD).all()
    assert (batch["tgt_out"][~batch["tgt_mask"]] == PAD).all()
    rows = torch.arange(len(src_lens))
    assert (batch["src"][rows, src_lens - 1] == EOS).all()
    assert (batch["tgt_out"][rows, tgt_lens - 1] == EOS).all()
    assert (batch["tgt_in"][:, 0] == BOS).all()
    # Teacher forcing: the input is the output shifted right by one.
    assert torch.equal(
        batch["tgt_in"][:, 1:] * batch["tgt_mask"][:, 1:],
        batch["tgt_out"][:, :-1] * batch["tgt_mask"][:, 1:],
    )


def test_collate_pads_with_zero_and_masks_match_lengths() -> None:
    items = [
        {"src_ids": [5, 6, 7], "tgt_ids": [8], "index": 4},
        {"src_ids": [9], "tgt_ids": [10, 11, 12], "index": 0},
    ]
    batch = collate(items)
    assert batch["src"].tolist() == [[5, 6, 7, EOS], [9, EOS, PAD, PAD]]
    assert batch["tgt_in"].tolist() == [[BOS, 8, PAD, PAD], [BOS, 10, 11, 12]]
    assert batch["tgt_out"].tolist() == [[8, EOS, PAD, PAD], [10, 11, 12, EOS]]
    assert batch["src_lens"].tolist() == [4, 2] and batch["index"].tolist() == [4, 0]
    assert batch["src_mask"].dtype == torch.bool and batch["src"].dtype == torch.long
    _check_batch(batch, budget=8)


def test_train_batches_respect_budget_and_cover_the_split(dm: TranslationDataModule) -> None:
    seen = []
    for batch in dm.train_dataloader():
        _check_batch(batch, BUDGET)
        seen += batch["index"].tolist()
    assert sorted(seen) == list(range(200))


def test_overlong_example_is_a_batch_of_one() -> None:
    batches = list(TokenBudgetBatchSampler([3, 100, 5, 2, 4], batch_tokens=10))
    assert [1] in batches and sorted(i for b in batches for i in b) == [0, 1, 2, 3, 4]


def test_shuffle_is_seeded_per_epoch() -> None:
    lengths = [i % 13 + 1 for i in range(300)]

    def order(seed: int, epoch: int) -> list[list[int]]:
        sampler = TokenBudgetBatchSampler(lengths, 40, shuffle=True, seed=seed)
        sampler.set_epoch(epoch)
        return list(sampler)

    assert order(1, 0) == order(1, 0)
    assert order(1, 0) != order(1, 1) and order(1, 0) != order(2, 0)
    assert sorted(i for b in order(1, 1) for i in b) == list(range(300))


def test_lightning_sets_the_epoch(dm: TranslationDataModule) -> None:
    loader = dm.train_dataloader()
    _set_sampler_epoch(loader, 3)  # what the fit loop calls at each epoch start
    assert loader.batch_sampler.epoch == 3


def test_two_ranks_get_disjoint_shares(
    dm: TranslationDataModule, monkeypatch: pytest.MonkeyPatch
) -> None:
    lengths = [i % 7 + 1 for i in range(101)]
    train = [list(TokenBudgetBatchSampler(lengths, 20, True, 1, 2, rank)) for rank in (0, 1)]
    assert len(train[0]) == len(train[1])
    assert not {i for b in train[0] for i in b} & {i for b in train[1] for i in b}
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


def test_eval_ranks_get_equal_batch_counts() -> None:
    lengths = [5] * 9
    counts = [len(TokenBudgetBatchSampler(lengths, 15, num_replicas=2, rank=r)) for r in (0, 1)]
    assert counts[0] == counts[1]


def test_references_follow_index(dm: TranslationDataModule, tiny_corpus: Path) -> None:
    assert dm.references("test") == (tiny_corpus / "test.en").read_text("utf-8").splitlines()
    assert dm.sources("val") == (tiny_corpus / "val.de").read_text("utf-8").splitlines()
    refs = dm.references("val")
    for batch in dm.val_dataloader():
        for row, index in zip(batch["tgt_out"].tolist(), batch["index"].tolist(), strict=True):
            assert dm.tokenizer.decode(row) == refs[index]


def test_limit_and_max_len(tiny_corpus: Path, tmp_path: Path) -> None:
    module = TranslationDataModule(
        data_dir=str(tiny_corpus),
        vocab_size=80,
        limit_train_pairs=50,
        max_len=12,
        cache_dir=str(tmp_path),
    )
    module.setup("fit")
    assert (
        module.sources("train") == (tiny_corpus / "train.de").read_text("utf-8").splitlines()[:50]
    )
    assert len(module.datasets["val"]) == 20
    assert module.counts["train/too_long"] > 0
    kept = [b for b in module.train_dataloader()]
    assert sum(len(b["index"]) for b in kept) == 50 - module.counts["train/too_long"]
    assert max(int(b["src_lens"].max()) for b in kept) <= 13


def test_empty_lines_counted(tmp_path: Path, tiny_corpus: Path) -> None:
    corpus = shutil.copytree(tiny_corpus, tmp_path / "corpus")
    for lang, first in [("de", "\n"), ("en", "A lone line\n")]:  # one pair, blank on one side
        path = corpus / f"train.{lang}"
        path.write_text(first + path.read_text("utf-8"), "utf-8")
    module = TranslationDataModule(data_dir=str(corpus), vocab_size=100, cache_dir=str(tmp_path))
    module.setup("fit")
    assert module.counts["train/empty"] == 1 and len(module.datasets["train"]) == 200


def test_test_split_option(tiny_corpus: Path, tmp_path: Path) -> None:
    module = TranslationDataModule(
        data_dir=str(tiny_corpus), vocab_size=100, cache_dir=str(tmp_path), test_split="val"
    )
    module.setup("test")
    assert module.split_names["test"] == "val" and module.references("test") == module.references(
        "val"
    )


def test_second_setup_skips_tokenization(
    dm: TranslationDataModule, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_map(*args: object, **kwargs: object) -> None:
        raise AssertionError("tokenized again")

    monkeypatch.setattr(datasets.Dataset, "map", no_map)
    again = TranslationDataModule(
        data_dir=dm.data_dir, vocab_size=100, batch_tokens=BUDGET, cache_dir=str(dm.cache_dir)
    )
    again.prepare_data()
    again.setup("fit")
    assert again.datasets["train"]["src_ids"][:] == dm.datasets["train"]["src_ids"][:]


def test_source_loader(tiny_tokenizer: Tokenizer) -> None:
    sentences = ["Der hund läuft im park", "", "Zwei kinder", "Ein mann"] * 5
    seen = {}
    for batch in source_loader(tiny_tokenizer, sentences, batch_tokens=24):
        assert set(batch) == {"src", "src_lens", "src_mask", "index"}
        assert len(batch["index"]) * batch["src"].shape[1] <= 24
        for row, n, index in zip(
            batch["src"].tolist(), batch["src_lens"].tolist(), batch["index"].tolist(), strict=True
        ):
            seen[index] = row[:n]
    assert sorted(seen) == list(range(20)) and seen[1] == [EOS]
    assert tiny_tokenizer.decode(seen[0]) == sentences[0]


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
