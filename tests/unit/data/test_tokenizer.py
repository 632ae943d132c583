import os
import pickle
from pathlib import Path

import pytest

from seq2seq.data import tokenizer as tok
from seq2seq.data.tokenizer import BOS, EOS, PAD, UNK, Tokenizer, load_or_train_tokenizer
from seq2seq.errors import UserError


def _val_sentences(corpus: Path) -> list[str]:
    return (corpus / "val.de").read_text("utf-8").splitlines()


def test_special_ids(tiny_tokenizer: Tokenizer) -> None:
    assert (PAD, UNK, BOS, EOS) == (0, 1, 2, 3)
    assert tiny_tokenizer.pieces([PAD, UNK, BOS, EOS]) == ["<pad>", "<unk>", "<s>", "</s>"]
    ids = tiny_tokenizer.encode("Der hund läuft")
    assert ids and not {PAD, BOS, EOS} & set(ids)
    assert tiny_tokenizer.vocab_size == 100


def test_encode_decode_round_trip(tiny_tokenizer: Tokenizer, tiny_corpus: Path) -> None:
    sentences = _val_sentences(tiny_corpus)
    batch = tiny_tokenizer.encode_batch(sentences)
    assert batch == [tiny_tokenizer.encode(s) for s in sentences]
    assert [tiny_tokenizer.decode(ids) for ids in batch] == sentences


def test_decode_skips_pad_bos_and_stops_at_eos(tiny_tokenizer: Tokenizer) -> None:
    ids = tiny_tokenizer.encode("Ein kleine hund")
    noisy = [BOS, *ids, EOS, *tiny_tokenizer.encode("und mehr"), PAD, PAD]
    assert tiny_tokenizer.decode(noisy) == "Ein kleine hund"
    assert len(tiny_tokenizer.pieces(ids)) == len(ids)


def test_bytes_and_pickle_round_trip(tiny_tokenizer: Tokenizer, tiny_corpus: Path) -> None:
    for copy in (
        Tokenizer.from_bytes(tiny_tokenizer.to_bytes()),
        pickle.loads(pickle.dumps(tiny_tokenizer)),
    ):
        sentences = _val_sentences(tiny_corpus)
        assert copy.encode_batch(sentences) == tiny_tokenizer.encode_batch(sentences)
        assert copy.to_bytes() == tiny_tokenizer.to_bytes()


def test_bad_model_bytes_is_user_error() -> None:
    with pytest.raises(UserError, match="not a sentencepiece model"):
        Tokenizer.from_bytes(b"definitely not a model")


def test_vocab_too_large_names_the_maximum(tiny_corpus: Path) -> None:
    texts = (tiny_corpus / "train.de").read_text("utf-8").splitlines()
    with pytest.raises(UserError, match=r"`vocab_size` 50000 is too large .*at most \d+"):
        Tokenizer.train(texts, vocab_size=50000)


def _count_training(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = Tokenizer.train.__func__

    def counting(cls, texts, vocab_size, model_type="unigram", sample=0):  # type: ignore[no-untyped-def]
        calls.append(vocab_size)
        return real(cls, texts, vocab_size, model_type, sample)

    monkeypatch.setattr(Tokenizer, "train", classmethod(counting))
    return calls


def test_cache_is_reused(
    tmp_path: Path, tiny_corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _count_training(monkeypatch)
    texts = lambda: (tiny_corpus / "train.en").read_text("utf-8").splitlines()  # noqa: E731
    first = load_or_train_tokenizer(tmp_path, texts, 60, key="tiny-en")
    path = tmp_path / f"spm-tiny-en-v60-{tok.RECIPE}.model"
    mtime = path.stat().st_mtime_ns
    second = load_or_train_tokenizer(tmp_path, texts, 60, key="tiny-en")
    assert calls == [60] and path.stat().st_mtime_ns == mtime
    assert second.to_bytes() == first.to_bytes()
    load_or_train_tokenizer(tmp_path, texts, 70, key="tiny-en")  # other settings, other file
    assert calls == [60, 70] and sorted(p.name for p in tmp_path.iterdir()) == [
        f"spm-tiny-en-v60-{tok.RECIPE}.model",
        f"spm-tiny-en-v60-{tok.RECIPE}.model.sha256",  # checked at every later load
        f"spm-tiny-en-v70-{tok.RECIPE}.model",
        f"spm-tiny-en-v70-{tok.RECIPE}.model.sha256",
    ]


def test_cache_write_is_atomic(
    tmp_path: Path, tiny_corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def crash(src: str, dst: str) -> None:
        raise KeyboardInterrupt  # an interrupt between writing and publishing

    monkeypatch.setattr(tok.os, "link", crash)
    texts = lambda: (tiny_corpus / "train.en").read_text("utf-8").splitlines()  # noqa: E731
    with pytest.raises(KeyboardInterrupt):
        load_or_train_tokenizer(tmp_path, texts, 60, key="tiny-en")
    assert os.listdir(tmp_path) == []  # neither a half model nor a stray temporary file


def test_the_first_model_published_wins(tmp_path: Path, tiny_corpus: Path) -> None:
    # Two machines whose lock did not reach each other train at once: the second one to finish
    # finds the first one's model in place, and uses it rather than replacing it.
    texts = lambda: (tiny_corpus / "train.en").read_text("utf-8").splitlines()  # noqa: E731
    first = load_or_train_tokenizer(tmp_path, texts, 60, key="tiny-en")
    path = tok.tokenizer_path(tmp_path, "tiny-en", 60)
    real_exists, calls = Path.exists, []
    Path.exists = lambda self: calls.append(self) or (False if self == path else real_exists(self))
    try:  # this process did not see the model before training: as if both trained at once
        other = load_or_train_tokenizer(tmp_path, lambda: texts()[:100], 60, key="tiny-en")
    finally:
        Path.exists = real_exists
    assert path in calls and other.to_bytes() == first.to_bytes() == path.read_bytes()
    assert sorted(os.listdir(tmp_path)) == [path.name, path.name + ".sha256"]  # the first's


def test_corrupt_cache_names_the_file(tmp_path: Path) -> None:
    (tmp_path / f"spm-k-v60-{tok.RECIPE}.model").write_bytes(b"\x00garbage")
    with pytest.raises(UserError, match=f"spm-k-v60-{tok.RECIPE}.model"):
        load_or_train_tokenizer(tmp_path, lambda: [], 60, key="k")


def test_training_threads_are_pinned_not_the_machine_s(
    tiny_corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # sentencepiece's result depends on its thread count, so the count is ours, whatever the machine
    # has; the model records the count it was trained with. Without the pin it would be
    # sentencepiece's default (16), so a value of our own, 3, shows that the pin is in force.
    from sentencepiece import sentencepiece_model_pb2

    texts = (tiny_corpus / "train.en").read_text("utf-8").splitlines()
    monkeypatch.setattr(tok, "TRAIN_THREADS", 3)
    for cores in (1, 64):
        monkeypatch.setattr(tok.os, "cpu_count", lambda cores=cores: cores)
        proto = sentencepiece_model_pb2.ModelProto()
        proto.ParseFromString(Tokenizer.train(texts, vocab_size=60).to_bytes())
        assert proto.trainer_spec.num_threads == 3


def test_sample_is_seeded_uniform_and_bounded() -> None:
    stream = [[f"s{i}" for i in range(start, start + 70)] for start in range(0, 700, 70)]
    sample = tok.sample_sentences(stream, 50, seed=4)
    assert len(sample) == len(set(sample)) == 50 and sample == tok.sample_sentences(stream, 50, 4)
    assert sample != tok.sample_sentences(stream, 50, seed=5)
    assert tok.sample_sentences(stream[:2], 500, seed=4) == stream[0] + stream[1]  # all, in order
    # Each of the 700 sentences is kept with probability 50/700: early ones as often as late ones.
    kept = [int(s[1:]) for seed in range(200) for s in tok.sample_sentences(stream, 50, seed)]
    first_half = sum(k < 350 for k in kept) / len(kept)
    assert 0.47 < first_half < 0.53  # 10,000 draws: the standard error is 0.005


def test_a_small_sample_size_is_accepted(tiny_corpus: Path) -> None:
    texts = (tiny_corpus / "train.en").read_text("utf-8").splitlines()[:50]
    for sample in (50, 101):  # sentencepiece's own cap takes only values over 100
        assert Tokenizer.train(texts, vocab_size=60, sample=sample).vocab_size == 60
