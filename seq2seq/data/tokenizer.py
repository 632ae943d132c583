"""One joint SentencePiece model for both languages, with fixed special ids.

The serialized model proto (`to_bytes`) is what travels inside checkpoints, so a checkpoint alone can
encode sources and decode hypotheses.
"""

from __future__ import annotations

import errno
import hashlib
import io
import multiprocessing
import os
import re
import sys
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from itertools import chain, islice
from pathlib import Path
from typing import Any

import numpy as np
import sentencepiece as spm

from seq2seq.atomic import atomic_write_text, fsync_folder
from seq2seq.errors import UserError

# What os.link answers on a file system without hard links (FAT, some FUSE and network mounts).
NO_HARD_LINKS = {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS, errno.EXDEV}

PAD, UNK, BOS, EOS = 0, 1, 2, 3
# sentencepiece's model depends on its trainer's thread count (1, 2 and 16 threads give three different
# Multi30k models): one fixed count gives every machine with the same sentencepiece version the same
# model (versions differ too: 0.2.2 and 0.2.3 share 6,409 of 8,000 pieces); more threads were no faster
# (docs/results/benchmarks.md#figures-once-kept-in-the-data-and-training-code).
TRAIN_THREADS = 1
# Part of cached model names: bumped when the training recipe changes, so old caches are not reused.
RECIPE = "t2"


class Tokenizer:
    """Subword tokenizer: `encode` gives ids without BOS/EOS; the data pipeline adds them."""

    def __init__(self, processor: spm.SentencePieceProcessor) -> None:
        specials = (processor.pad_id(), processor.unk_id(), processor.bos_id(), processor.eos_id())
        if specials != (PAD, UNK, BOS, EOS):
            raise UserError(
                f"sentencepiece model has special ids pad/unk/bos/eos = {specials}, "
                f"expected {(PAD, UNK, BOS, EOS)}"
            )
        self._sp = processor

    @classmethod
    def train(
        cls, texts: Iterable[str], vocab_size: int, model_type: str = "unigram", sample: int = 0
    ) -> Tokenizer:
        """Train a model in memory on `texts` (a sample of both sides of the training split, see
        `sample_sentences`); `sample` > 0: sentencepiece keeps at most that many of them."""
        model = io.BytesIO()
        try:
            spm.SentencePieceTrainer.train(
                sentence_iterator=iter(texts),
                model_writer=model,
                vocab_size=vocab_size,
                model_type=model_type,
                pad_id=PAD,
                unk_id=UNK,
                bos_id=BOS,
                eos_id=EOS,
                character_coverage=1.0,
                # A guard (our sample is never larger), which sentencepiece takes only above 100.
                input_sentence_size=sample if sample > 100 else 0,
                shuffle_input_sentence=True,
                num_threads=TRAIN_THREADS,
                minloglevel=2,  # sentencepiece otherwise prints hundreds of lines to stderr
            )
        except RuntimeError as err:
            # The C++ message carries the reachable maximum: "... Please set it to a value <= 35."
            found = re.search(r"value <= (\d+)", str(err))
            if found:
                raise UserError(
                    f"`vocab_size` {vocab_size} is too large for this corpus "
                    f"(at most {found.group(1)})"
                ) from None
            reason = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
            raise UserError(
                f"sentencepiece could not train with `vocab_size` {vocab_size}: {reason}"
            ) from None
        return cls.from_bytes(model.getvalue())

    @classmethod
    def from_bytes(cls, data: bytes) -> Tokenizer:
        """Load a serialized model proto, as written by `to_bytes`."""
        processor = spm.SentencePieceProcessor()
        try:
            processor.LoadFromSerializedProto(data)
        except (RuntimeError, OSError, TypeError) as err:
            raise UserError(f"not a sentencepiece model ({len(data)} bytes): {err}") from None
        return cls(processor)

    def to_bytes(self) -> bytes:
        return self._sp.serialized_model_proto()

    @property
    def vocab_size(self) -> int:
        return self._sp.vocab_size()

    def encode(self, text: str) -> list[int]:
        return self._sp.encode(text, out_type=int)

    def encode_batch(self, texts: list[str], threads: int = -1) -> list[list[int]]:
        """One C++ call for the whole list, on `threads` threads (-1: sentencepiece's default)."""
        return self._sp.encode(texts, out_type=int, num_threads=threads)

    def encode_flat(self, texts: list[str], dtype: type) -> tuple[np.ndarray, np.ndarray]:
        """Lengths (B,) int64 and all ids one after another (sum of lengths,) as `dtype`, compact
        to send between processes; on one thread, as processes share the cores."""
        ids = self.encode_batch(texts, threads=1) if texts else []
        lengths = np.fromiter(map(len, ids), np.int64, len(ids))  # (B,)
        return lengths, np.fromiter(chain.from_iterable(ids), dtype, int(lengths.sum()))

    def decode(self, ids: list[int]) -> str:
        """Text of `ids`, ignoring PAD and BOS and everything from the first EOS on."""
        kept = []
        for i in ids:
            if i == EOS:
                break
            if i not in (PAD, BOS):
                kept.append(int(i))
        return self._sp.decode(kept)

    def pieces(self, ids: list[int]) -> list[str]:
        """Subword strings of `ids` (for attention plot axes)."""
        return [self._sp.id_to_piece(int(i)) for i in ids]

    def encode_with_spans(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """`encode(text)` and, per id, the (start, end) characters of the raw `text` it covers,
        normalisation undone (empty for a marker sentencepiece added); for word alignments."""
        proto = self._sp.encode(text, return_type="proto")
        return [p.id for p in proto.pieces], _char_spans(text, proto.pieces)

    def decode_with_spans(self, ids: list[int]) -> tuple[str, list[tuple[int, int]]]:
        """The text of `ids` (no BOS, EOS or PAD among them) and, per id, its (start, end)
        characters in that text."""
        proto = self._sp.decode([int(i) for i in ids], return_type="proto")
        return proto.text, _char_spans(proto.text, proto.pieces)

    def __getstate__(self) -> dict[str, bytes]:
        # The SWIG processor does not pickle; DataLoader workers and deepcopy need this.
        return {"model": self.to_bytes()}

    def __setstate__(self, state: dict[str, bytes]) -> None:
        self._sp = Tokenizer.from_bytes(state["model"])._sp


def _char_spans(text: str, pieces: Iterable) -> list[tuple[int, int]]:
    """sentencepiece's UTF-8 byte offsets (`begin`, `end` of each piece) as character offsets."""
    if text.isascii():  # one byte a character: the offsets are the same
        return [(p.begin, p.end) for p in pieces]
    char_of_byte, byte = {0: 0}, 0
    for i, char in enumerate(text):
        byte += len(char.encode())
        char_of_byte[byte] = i + 1
    return [(char_of_byte[p.begin], char_of_byte[p.end]) for p in pieces]


Texts = Any  # anything with lists of sentences `src` and `tgt`: seq2seq.data.corpus.Pairs
_worker: Tokenizer | None = None  # the tokenizer of an encoding process, set by _start_worker


def encode_chunks(
    chunks: Iterator[Texts],
    tokenizer: Tokenizer,
    workers: int,
    dtype: type,
    job: Callable[[Tokenizer, Texts, type], tuple[np.ndarray, ...]] | None = None,
) -> Iterator[tuple[Texts, tuple[np.ndarray, ...]]]:
    """(chunk, (src lengths, src ids, tgt lengths, tgt ids)) in order, see `encode_flat`; with
    `workers` > 1 encoded by that many processes while the caller reads and writes, two chunks a
    worker in flight at most, so memory stays flat. `job(tokenizer, chunk, dtype)`, a module-level
    function (it runs in the workers), replaces that encoding and may return more arrays."""
    job = job or _encode_chunk
    first = list(islice(chunks, 2))  # one chunk alone is not worth starting processes for
    chunks = chain(first, chunks)
    if workers <= 1 or len(first) < 2:
        yield from ((c, job(tokenizer, c, dtype)) for c in chunks)
        return
    # fork: workers start at once and share this process's pages; they use sentencepiece and
    # numpy only (no torch, no threads of the parent's). Elsewhere (macOS) spawn, its safe default.
    context = multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")
    model = tokenizer.to_bytes()
    with ProcessPoolExecutor(
        workers, context, initializer=_start_worker, initargs=(model, os.getpid())
    ) as pool:
        pending: deque = deque()
        try:
            for chunk in chunks:
                pending.append((chunk, pool.submit(_run_job, job, chunk, dtype)))
                if len(pending) >= 2 * workers:
                    done, future = pending.popleft()
                    yield done, future.result()
            yield from ((done, future.result()) for done, future in pending)
        except BaseException:  # a stop, an error, or the caller closing early: the queue is dropped
            pool.shutdown(cancel_futures=True)  # waits for the chunks being encoded only
            raise


def _start_worker(model: bytes, parent: int) -> None:
    global _worker
    from seq2seq.data.cachelock import die_with_parent

    die_with_parent(parent)  # a killed builder leaves no worker behind
    _worker = Tokenizer.from_bytes(model)


def _run_job(job: Callable, chunk: Texts, dtype: type) -> tuple[np.ndarray, ...]:
    return job(_worker, chunk, dtype)  # in a worker process: its own copy of the tokenizer


def _encode_chunk(tokenizer: Tokenizer, chunk: Texts, dtype: type) -> tuple[np.ndarray, ...]:
    return (*tokenizer.encode_flat(chunk.src, dtype), *tokenizer.encode_flat(chunk.tgt, dtype))


def sample_sentences(batches: Iterable[Sequence[str]], size: int, seed: int) -> list[str]:
    """A uniform random sample of `size` sentences from a stream of batches (the whole stream when
    it is shorter), the same for the same stream and seed, in memory of `size` sentences.

    Reservoir sampling (Algorithm R): sentence t of the stream (0-based) replaces a random one of
    the sample with probability size / (t + 1); the draws are numpy's, one call per batch.
    """
    rng, sample, seen = np.random.default_rng(seed), [], 0
    for batch in batches:
        fill = min(size - len(sample), len(batch))  # the sample is not full yet: take them all
        sample += batch[:fill]
        if fill < len(batch):
            slots = rng.integers(
                0, np.arange(seen + fill, seen + len(batch)) + 1
            )  # uniform in [0, t]
            hits = np.flatnonzero(slots < size)
            for i, slot in zip((hits + fill).tolist(), slots[hits].tolist(), strict=True):
                sample[slot] = batch[i]  # in stream order: a later hit on a slot wins
        seen += len(batch)
    return sample


def tokenizer_path(cache_dir: str | Path, key: str, vocab_size: int) -> Path:
    """Where `load_or_train_tokenizer` keeps the model for `key` and `vocab_size`."""
    return Path(cache_dir) / f"spm-{key}-v{vocab_size}-{RECIPE}.model"


def checksum_path(path: Path) -> Path:
    """The SHA-256 of a cached model, written beside it before it is published."""
    return path.with_name(path.name + ".sha256")


def load_tokenizer(path: Path) -> Tokenizer:
    """A cached model, checked against its checksum when it has one; a damaged or corrupt file is a
    UserError naming it. (A cut model can still parse: one cut at 135,168 bytes loaded as a
    7,598-piece tokenizer, which would encode the corpus with other ids.)"""
    data = path.read_bytes()
    try:
        expected = checksum_path(path).read_text().strip()
    except OSError:
        expected = None  # a cache of an earlier version, or a model placed by hand
    if expected is not None and hashlib.sha256(data).hexdigest() != expected:
        raise UserError(
            f"{path}: damaged ({len(data):,} bytes that do not match its checksum "
            f"{checksum_path(path).name}); delete both to retrain"
        )
    try:
        return Tokenizer.from_bytes(data)
    except UserError as err:
        raise UserError(f"{path}: {err} (delete it to retrain)") from None


def load_or_train_tokenizer(
    cache_dir: Path,
    texts_fn: Callable[[], Iterable[str]],
    vocab_size: int,
    key: str,
    sample: int = 0,
) -> Tokenizer:
    """Load `tokenizer_path(cache_dir, key, vocab_size)`, or train it from `texts_fn()` and cache it.

    Args:
        cache_dir: folder for cached models (created if missing).
        texts_fn: called only on a cache miss; yields the training sentences.
        vocab_size: number of pieces, specials included.
        key: corpus identity and settings (name, langs, limit, file hash, sample size and seed);
            must be filename-safe.
        sample: at most this many sentences are trained on (0: all); see `Tokenizer.train`.
    """
    from seq2seq.data.cachelock import remove_orphans, temporary_name

    cache_dir = Path(cache_dir)
    path = tokenizer_path(cache_dir, key, vocab_size)
    if path.exists():
        return load_tokenizer(path)
    tokenizer = Tokenizer.train(texts_fn(), vocab_size, sample=sample)
    cache_dir.mkdir(parents=True, exist_ok=True)
    remove_orphans(path, lambda message: print(f"prepare: {message}", file=sys.stderr))
    # Written beside the target under this process's name, fsynced, then published with a hard
    # link, which fails when the name exists: a kill leaves no half model, and where two machines
    # trained at once (a lock that did not reach across them) the first model published is the one
    # both use. The publisher then writes its checksum beside it, for every later load to check.
    data = tokenizer.to_bytes()
    tmp = temporary_name(path)
    try:
        try:
            with open(tmp, "wb") as file:
                file.write(data)
                file.flush()
                os.fsync(file.fileno())
            os.chmod(tmp, 0o644)  # the cache is shared like the data
        except OSError as err:  # a full disk, a quota: nothing is published
            raise UserError(
                f"`cache_dir` {cache_dir}: cannot write the tokenizer ({err.strerror})"
            ) from None
        try:
            os.link(tmp, path)
        except FileExistsError:
            return load_tokenizer(path)
        except OSError as err:
            if err.errno not in NO_HARD_LINKS:
                raise UserError(
                    f"`cache_dir` {cache_dir}: cannot publish the tokenizer ({err.strerror})"
                ) from None
            os.replace(tmp, path)  # a file system without hard links: a rename is atomic too
        fsync_folder(path.parent)
        atomic_write_text(checksum_path(path), hashlib.sha256(data).hexdigest() + "\n")
    finally:
        tmp.unlink(missing_ok=True)
    return tokenizer
