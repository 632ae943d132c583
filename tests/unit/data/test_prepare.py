"""The preparation step: cache layout, atomic writes, shards and encoding workers (two processes on
one cold cache: tests/e2e/test_prepare.py)."""

import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from seq2seq.commands import prepare as prepare_command
from seq2seq.data import prepare as prep
from seq2seq.data.datamodule import TranslationDataModule, load_split
from seq2seq.data.shards import SplitRows, record_batch, split_schema
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.errors import UserError
from seq2seq.training.config import TrainConfig


def _cfg(corpus: Path, cache: Path, **settings: object) -> TrainConfig:
    settings = {"vocab_size": 100, "prepare_workers": 1, **settings}
    return TrainConfig(data_dir=str(corpus), cache_dir=str(cache), **settings)


def _column(prepared: prep.Prepared, split: str, name: str) -> list:
    return load_split(prepared.paths[split]).data.column(name).to_pylist()


def test_second_call_reads_the_cache_and_ids_round_trip(
    tiny_corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = prep.prepare(_cfg(tiny_corpus, tmp_path))
    monkeypatch.setattr(prep, "encode_chunks", lambda *args: pytest.fail("encoded again"))
    again = prep.prepare(_cfg(tiny_corpus, tmp_path))
    assert first.built and not again.built and again.paths == first.paths
    val = load_split(again.paths["val"])
    assert val.data.schema.field("src_ids").type == pa.list_(pa.uint16())
    sentences = (tiny_corpus / "val.de").read_text("utf-8").splitlines()
    assert _column(again, "val", "src_ids") == again.tokenizer.encode_batch(sentences)
    assert [again.tokenizer.decode(ids) for ids in val["src_ids"][:]] == sentences
    assert _column(again, "train", "index") == list(range(200))
    assert "src" not in load_split(again.paths["train"]).column_names  # ids only


def test_large_vocabularies_get_uint32_ids(tiny_tokenizer: Tokenizer) -> None:
    src, tgt = ["Der hund", "Ein ball"], ["The dog", "A ball"]
    for dtype, arrow in ((np.uint16, pa.uint16()), (np.uint32, pa.uint32())):
        ids = (*tiny_tokenizer.encode_flat(src, dtype), *tiny_tokenizer.encode_flat(tgt, dtype))
        batch = record_batch(prep.Pairs(src, tgt), ids, 5, split_schema(dtype, text=True))
        assert batch.schema.field("tgt_ids").type == pa.list_(arrow)
        assert batch.column("tgt_ids").to_pylist() == tiny_tokenizer.encode_batch(tgt)
        assert batch.column("index").to_pylist() == [5, 6]


def test_spm_model_is_used_as_given(
    tiny_corpus: Path, tiny_tokenizer: Tokenizer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tmp_path / "given.model"
    model.write_bytes(tiny_tokenizer.to_bytes())
    monkeypatch.setattr(Tokenizer, "train", lambda *args, **kw: pytest.fail("trained one"))
    prepared = prep.prepare(_cfg(tiny_corpus, tmp_path / "cache", spm_model=str(model)))
    assert prepared.tokenizer.to_bytes() == model.read_bytes()
    assert not list((tmp_path / "cache").glob("spm-*"))  # nothing trained, nothing cached
    with pytest.raises(UserError, match="`spm_model` .*missing.model: cannot read"):
        prep.prepare(
            _cfg(tiny_corpus, tmp_path / "cache", spm_model=str(tmp_path / "missing.model"))
        )


def test_spm_sample_is_seeded(tiny_corpus: Path, tmp_path: Path) -> None:
    def model(cache: str, seed: int) -> bytes:
        cfg = _cfg(tiny_corpus, tmp_path / cache, spm_sample=150, seed=seed)  # of 400 sentences
        return prep.prepare(cfg).tokenizer.to_bytes()

    assert model("a", 1) == model("b", 1) != model("c", 2)


def test_parallel_encoding_and_shards_equal_one_process(
    tiny_corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    one = prep.prepare(_cfg(tiny_corpus, tmp_path / "one"))
    monkeypatch.setattr(prep, "SHARD_PAIRS", 70)
    many = prep.prepare(_cfg(tiny_corpus, tmp_path / "many", prepare_workers=2), chunk_size=30)
    assert len(many.meta["train"]["shards"]) == 3  # 90 + 90 + 20 rows
    for name in ("index", "src_ids", "tgt_ids", "src_len"):
        assert _column(many, "train", name) == _column(one, "train", name)


def test_a_crash_mid_write_leaves_no_cache_and_the_next_call_rebuilds(
    tiny_corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real, calls = prep.record_batch, []

    def crash_on_third(*args: object) -> pa.RecordBatch:
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt  # a kill in the middle of the training split
        return real(*args)

    monkeypatch.setattr(prep, "record_batch", crash_on_third)
    with pytest.raises(KeyboardInterrupt):
        prep.prepare(_cfg(tiny_corpus, tmp_path), chunk_size=30)
    assert list((tmp_path / "encoded").iterdir()) == []  # neither a half split nor a temporary
    cfg = _cfg(tiny_corpus, tmp_path)
    tokenizer = prep.load_tokenizer(next(tmp_path.glob("spm-*.model")))  # trained before the crash
    path = prep._split_path(cfg, prep.resolve_corpus("", str(tiny_corpus)), "train", tokenizer)
    killed = path.with_name(f".{path.name}.x1y2")  # what a SIGKILL would leave behind
    killed.mkdir()
    monkeypatch.setattr(prep, "record_batch", real)
    rebuilt = prep.prepare(cfg, chunk_size=30)
    assert rebuilt.built and rebuilt.meta["train"]["rows"] == 200 and not killed.exists()
    assert set((tmp_path / "encoded").iterdir()) == set(rebuilt.paths.values())


def test_prepare_script_reports_the_cache(tiny_corpus: Path, tmp_path: Path, capsys) -> None:
    script = prepare_command
    flags = ["--data-dir", str(tiny_corpus), "--vocab-size", "100", "--cache-dir", str(tmp_path)]
    assert script.main(flags) == 0
    out = capsys.readouterr().out
    assert f"built: cache {tmp_path}" in out and "bytes/pair" in out and "train" in out
    assert script.main(flags) == 0 and "already prepared" in capsys.readouterr().out
    assert script.main([*flags, "--spm-sample", "0"]) == 2
    assert "error: --spm-sample must be positive" in capsys.readouterr().err


def test_training_reads_rows_without_mapping_the_split(
    tiny_corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    corpus = shutil.copytree(tiny_corpus, tmp_path / "corpus")
    for lang in ("de", "en"):  # a chunk of 30 blank pairs: a record batch without rows
        lines = (corpus / f"train.{lang}").read_text("utf-8").splitlines(keepends=True)
        (corpus / f"train.{lang}").write_text("".join(lines[:60] + ["\n"] * 30 + lines[60:]))
    monkeypatch.setattr(prep, "SHARD_PAIRS", 70)  # rows spread over shards and record batches
    prep.prepare(_cfg(corpus, tmp_path), chunk_size=30)
    dm = TranslationDataModule(_cfg(corpus, tmp_path))
    dm.setup("fit")
    assert dm.counts["train/empty"] == 30
    assert sum(len(batch["index"]) for batch in dm.train_dataloader()) == 200
    path = dm.datasets.paths["train"]
    assert str(path) not in Path("/proc/self/maps").read_text()  # read, never memory-mapped
    train, rows = dm.datasets["train"], SplitRows(path)  # the Arrow view, as a reference
    some = [0, 89, 90, 91, 199, 7]
    columns = ("index", "src_ids", "tgt_ids")
    assert rows.__getitems__(some) == [{k: train[i][k] for k in columns} for i in some]
    assert [x.tolist() for x in rows.lengths()] == [train["src_len"][:], train["tgt_len"][:]]


def test_cores_fall_back_to_the_cpu_count_without_affinity(monkeypatch: pytest.MonkeyPatch) -> None:
    from seq2seq.machine import cores

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {1, 3}, raising=False)  # taskset
    assert cores() == 2
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)  # as on macOS
    assert cores() == (os.cpu_count() or 1)
