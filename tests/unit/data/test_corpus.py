import gzip
import json
import os
import shutil
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from seq2seq.data import corpus
from seq2seq.data.corpus import read_pairs, resolve_corpus
from seq2seq.errors import UserError


@pytest.fixture(autouse=True)
def _no_data_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """Corpora by name are looked for as a shell without SEQ2SEQ_DATA looks for them."""
    monkeypatch.delenv("SEQ2SEQ_DATA", raising=False)


def _lines(folder: Path, name: str) -> list[str]:
    return (folder / name).read_text("utf-8").splitlines()


def test_resolution_order(
    tmp_path: Path, tiny_corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = tmp_path / "shared" / "data"
    shutil.copytree(tiny_corpus, shared / "toy")
    monkeypatch.setattr(corpus, "SHARED_DATA", shared)
    monkeypatch.chdir(tmp_path)
    assert resolve_corpus("toy").folder == shared / "toy"  # no data/toy here: the shared mirror
    local = tmp_path / "data" / "toy"
    shutil.copytree(tiny_corpus, local)
    assert resolve_corpus("toy").folder == Path("data/toy")  # a local folder wins
    assert resolve_corpus("toy", data_dir=str(tiny_corpus)).folder == tiny_corpus
    with pytest.raises(UserError, match="`data_dir` .*no such folder"):
        resolve_corpus("toy", data_dir=str(tmp_path / "missing"))


def test_the_variable_s_folders_come_first_and_nothing_is_the_checkout_s(
    tmp_path: Path, tiny_corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    shutil.copytree(tiny_corpus, second / "toy")
    shutil.copytree(tiny_corpus, tmp_path / "work" / "data" / "toy")
    monkeypatch.chdir(tmp_path / "work")
    monkeypatch.setenv("SEQ2SEQ_DATA", os.pathsep.join([str(first), str(second)]))
    assert resolve_corpus("toy").folder == second / "toy"  # the first folder holds no toy
    monkeypatch.delenv("SEQ2SEQ_DATA")
    assert resolve_corpus("toy").folder == Path("data/toy")  # then the current folder's
    # The shared mirror is ../shared/data of the current folder, not of the package's checkout.
    assert corpus.corpus_folders("toy")[-1] == tmp_path / "shared" / "data" / "toy"


def test_unknown_name_offline_lists_places(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(corpus, "SHARED_DATA", tmp_path / "shared")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError) as err:
        resolve_corpus("no-such-corpus")
    message = str(err.value)
    assert str(tmp_path / "data" / "no-such-corpus") in message
    assert str(tmp_path / "shared" / "no-such-corpus") in message
    assert "hub" in message and "\n" not in message


def test_reads_aligned_pairs_and_limit(tiny_corpus: Path) -> None:
    source = resolve_corpus("tiny", data_dir=str(tiny_corpus))
    assert source.splits() == ["test", "train", "val"] and source.langs("train") == ["de", "en"]
    pairs = read_pairs(source, "train", "de", "en")
    assert pairs.src == _lines(tiny_corpus, "train.de") and pairs.tgt == _lines(
        tiny_corpus, "train.en"
    )
    first = read_pairs(source, "train", "en", "de", limit=7)
    assert first.src == pairs.tgt[:7] and first.tgt == pairs.src[:7]


def test_line_count_mismatch_names_both(tmp_path: Path) -> None:
    (tmp_path / "train.de").write_text("a\nb\nc\n")
    (tmp_path / "train.en").write_text("a\nb\n")
    with pytest.raises(UserError, match=r"train\.de has 3 lines but .*train\.en has 2"):
        read_pairs(resolve_corpus("x", str(tmp_path)), "train", "de", "en")


def test_non_utf8_names_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "train.de").write_bytes("eins\nzwei\ndrei \xfc\n".encode("latin-1"))
    (tmp_path / "train.en").write_text("one\ntwo\nthree\n")
    with pytest.raises(UserError, match=r"train\.de line 3: not valid UTF-8"):
        read_pairs(resolve_corpus("x", str(tmp_path)), "train", "de", "en")


def test_unknown_split_or_language_lists_existing(tiny_corpus: Path) -> None:
    source = resolve_corpus("tiny", data_dir=str(tiny_corpus))
    with pytest.raises(UserError, match=r"no split 'dev2' \(it has: test, train, val\)"):
        read_pairs(source, "dev2", "de", "en")
    with pytest.raises(UserError, match=r"no language 'fr' \(it has: de, en\)"):
        read_pairs(source, "train", "fr", "en")


def test_empty_pairs_dropped_and_counted(tmp_path: Path) -> None:
    (tmp_path / "train.de").write_text("eins\n\nzwei\ndrei\n  \nvier\n")
    (tmp_path / "train.en").write_text("one\ntwo\n\nthree\nfour\nfour\n")
    pairs = read_pairs(resolve_corpus("x", str(tmp_path)), "train", "de", "en")
    assert (pairs.src, pairs.tgt, pairs.empty) == (
        ["eins", "drei", "vier"],
        ["one", "three", "four"],
        3,
    )


def test_gz_tsv_jsonl_read_the_same_pairs(tmp_path: Path, tiny_corpus: Path) -> None:
    de, en = _lines(tiny_corpus, "val.de"), _lines(tiny_corpus, "val.en")
    layouts = {
        "gz": {
            f"val.{k}.gz": gzip.compress("\n".join(v).encode()) for k, v in [("de", de), ("en", en)]
        },
        "tsv": {"val.tsv": "".join(f"{d}\t{e}\n" for d, e in zip(de, en, strict=True)).encode()},
        "tsv_header": {
            "val.tsv": (
                "en\tde\n" + "".join(f"{e}\t{d}\n" for d, e in zip(de, en, strict=True))
            ).encode()
        },
        "jsonl": {
            "val.jsonl": "".join(
                json.dumps({"de": d, "en": e}) + "\n" for d, e in zip(de, en, strict=True)
            ).encode()
        },
        "jsonl_translation": {
            "val.jsonl": "".join(
                json.dumps({"translation": {"en": e, "de": d}}) + "\n"
                for d, e in zip(de, en, strict=True)
            ).encode()
        },
    }
    for name, files in layouts.items():
        folder = tmp_path / name
        folder.mkdir()
        for file, data in files.items():
            (folder / file).write_bytes(data)
        pairs = read_pairs(resolve_corpus(name, str(folder)), "val", "de", "en")
        assert (pairs.src, pairs.tgt) == (de, en), name


def test_bad_tsv_and_jsonl_rows_name_the_line(tmp_path: Path) -> None:
    (tmp_path / "train.tsv").write_text("a\tb\nc\n")
    with pytest.raises(UserError, match=r"train\.tsv line 2: 1 tab-separated columns"):
        read_pairs(resolve_corpus("x", str(tmp_path)), "train", "de", "en")
    (tmp_path / "train.tsv").unlink()
    (tmp_path / "train.jsonl").write_text('{"de": "a", "en": "b"}\n{"de": "c"}\n')
    with pytest.raises(UserError, match=r"train\.jsonl line 2: no 'de'/'en'"):
        read_pairs(resolve_corpus("x", str(tmp_path)), "train", "de", "en")


def test_hub_translation_and_flat_columns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rows = {"de": ["ein hund", "", "zwei"], "en": ["a dog", "x", "two"]}
    flat = datasets.DatasetDict({"validation": datasets.Dataset.from_dict(rows)})
    as_dicts = [dict(zip(rows, r, strict=True)) for r in zip(*rows.values(), strict=True)]
    wmt = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"translation": as_dicts})})
    hubs = {"bentrevett/multi30k": flat, "wmt-like": wmt}
    monkeypatch.setattr(datasets, "load_dataset", lambda hub_id, *config: hubs[hub_id])
    monkeypatch.setattr(corpus, "SHARED_DATA", tmp_path / "shared")
    monkeypatch.chdir(tmp_path)
    for name, split in [("multi30k", "val"), ("wmt-like", "train")]:
        source = resolve_corpus(name)
        assert source.langs(source.find_split(split)) == ["de", "en"]
        pairs = read_pairs(source, split, "de", "en")
        assert (pairs.src, pairs.tgt, pairs.empty) == (["ein hund", "zwei"], ["a dog", "two"], 1)
        chunks = corpus.stream_pairs(source, split, "de", "en", chunk_size=2)  # streams, too
        assert [(c.src, c.empty) for c in chunks] == [(["ein hund"], 1), (["zwei"], 0)]


def _whole_file_pairs(folder: Path, split: str) -> tuple[list[str], list[str], int]:
    """The pre-streaming reader, as a reference: whole files, split on '\\n', stripped, blanks out."""
    sides = []
    for lang in ("de", "en"):
        path = next(folder.glob(f"{split}.{lang}*"))
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        lines = raw.decode().split("\n")
        sides.append([s.strip() for s in (lines[:-1] if lines[-1] == "" else lines)])
    kept = [(s, t) for s, t in zip(*sides, strict=True) if s and t]
    return [s for s, _ in kept], [t for _, t in kept], len(sides[0]) - len(kept)


@pytest.mark.parametrize("chunk", [1, 7, 10_000])
def test_streaming_equals_whole_file_read(tmp_path: Path, tiny_corpus: Path, chunk: int) -> None:
    for name in ("plain", "gz"):
        folder = shutil.copytree(tiny_corpus, tmp_path / name)
        for lang, first in [("de", "\n"), ("en", "A lone line\r\n")]:  # a blank pair, a CRLF
            path = folder / f"train.{lang}"
            path.write_bytes(first.encode() + path.read_bytes() + b"  \n")  # and a blank last line
            if name == "gz":
                path.with_name(path.name + ".gz").write_bytes(gzip.compress(path.read_bytes()))
                path.unlink()
        src, tgt, empty = _whole_file_pairs(folder, "train")
        source = resolve_corpus(name, str(folder))
        chunks = list(corpus.stream_pairs(source, "train", "de", "en", chunk_size=chunk))
        assert all(len(c) + c.empty <= chunk for c in chunks)
        assert [s for c in chunks for s in c.src] == src and empty == 2
        assert ([t for c in chunks for t in c.tgt], sum(c.empty for c in chunks)) == (tgt, empty)
        limited = list(corpus.stream_pairs(source, "train", "de", "en", limit=9, chunk_size=chunk))
        assert [s for c in limited for s in c.src] == src[:9]


def test_parquet_folder_reads_like_a_hub_dataset(tmp_path: Path, tiny_corpus: Path) -> None:
    de, en = _lines(tiny_corpus, "train.de"), _lines(tiny_corpus, "train.en")
    shards = tmp_path / "hubby" / "data"
    shards.mkdir(parents=True)
    for i, part in enumerate((slice(0, 120), slice(120, None))):  # two shards, hub names
        rows = [{"de": d, "en": e} for d, e in zip(de[part], en[part], strict=True)]
        pq.write_table(pa.table({"translation": rows}), shards / f"train-0000{i}-of-00002.parquet")
    pq.write_table(
        pa.table({"en": en[:5], "de": de[:5], "n": list(range(5))}), shards / "val.parquet"
    )
    source = resolve_corpus("hubby", str(tmp_path / "hubby"))
    assert source.splits() == ["train", "val"] and source.langs("train") == ["de", "en"]
    chunks = list(corpus.stream_pairs(source, "train", "en", "de", chunk_size=50))
    assert [len(c) for c in chunks] == [50, 50, 20, 50, 30]  # never more than a chunk in memory
    assert [s for c in chunks for s in c.src] == en and [t for c in chunks for t in c.tgt] == de
    assert source.langs("val") == ["de", "en"]  # string columns only
    assert read_pairs(source, "val", "de", "en").tgt == en[:5]
