"""Preparation: corpus -> joint sentencepiece model -> encoded Arrow shards, built once per cache.

It streams: the corpus is read `chunk_size` pairs at a time, the tokenizer trains on a seeded sample
of `spm_sample` sentences, and worker processes encode chunks while this one writes them. In
`cache_dir`: `spm-<corpus>-s<sample>-r<seed>-v<vocab>-<recipe>.model` (unless `spm_model`), a
`<corpus>.lock` file, and `encoded/<corpus>-<split>-...-<tokenizer hash>/` per split: meta.json and
Arrow IPC stream shards of SHARD_PAIRS rows with columns index (uint32), src_len, tgt_len (uint16,
saturating), src_ids, tgt_ids (uint16 ids; uint32 over 65,536 pieces) and, in all splits but train,
the raw text (BLEU, heatmaps, alignments); with `guided_alignment`, the train split also has `links`
(list<uint16>, seq2seq.data.links) and its folder name the alignment file's key, so a cache built without
links, or with another file, is never read for it.

Faults (seq2seq.data.cachelock): one process builds, holding the cache's lock; the others wait, then find
the cache complete (Lightning's launcher, torchrun, SLURM alike). A split is written into a temporary
folder named after its builder and renamed when whole, so a kill -9 at any line leaves either no
split or a whole one, plus at most a temporary that the next build removes once its owner is gone.
The lock dies with its holder, and the encoding workers die with it too.

Stops (seq2seq.training.stops): given `stop`, a function that returns the reason once a polite stop is
asked for, preparation asks it before each chunk it reads (sampling for the tokenizer, encoding) and
at each try of a lock held by another process, and raises `Stopped` with nothing new to save. The
split being written is then removed (its temporary folder, by this process), the encoding workers
are stopped with their queued chunks, and the lock is released: the next start builds the rest. What
was published before the stop (the tokenizer, whole splits) is kept. Training sentencepiece is one
call into its library that cannot be interrupted: a stop during it is honoured after it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import resource
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from seq2seq.atomic import atomic_write_text, fsync_folder
from seq2seq.data.cachelock import check_stop, exclusive, remove_orphans, temporary_name
from seq2seq.data.config import DataConfig
from seq2seq.data.corpus import CHUNK_PAIRS, CorpusSource, Pairs, resolve_corpus, stream_pairs
from seq2seq.data.links import attach_links, encode_with_links, links_suffix
from seq2seq.data.shards import (
    SHARD_PAIRS,
    DamagedSplit,
    checked_meta,
    fsynced,
    next_shard,
    record_batch,
    shard_digest,
    split_schema,
    write_reason,
)
from seq2seq.data.tokenizer import (
    TRAIN_THREADS,
    Tokenizer,
    encode_chunks,
    load_or_train_tokenizer,
    load_tokenizer,
    sample_sentences,
    tokenizer_path,
)
from seq2seq.errors import UserError
from seq2seq.machine import cores

FORMAT = 1  # bumped when the folder layout changes, so old caches are not read


@dataclass
class Prepared:
    """A complete cache: its tokenizer, and split folders and meta.json by role (train/val/test)."""

    tokenizer: Tokenizer
    tokenizer_file: Path
    paths: dict[str, Path]
    split_names: dict[str, str]
    location: str
    meta: dict[str, dict[str, Any]]
    built: bool = False


def prepare(
    cfg: DataConfig,
    test_split: str | None = None,
    chunk_size: int = CHUNK_PAIRS,
    stop: Callable[[], str | None] | None = None,
    budget: Callable[[], str | None] | None = None,
) -> Prepared:
    """Make sure the cache of `cfg`'s data settings is complete and return it (`built`: by this
    call); safe to call from every process at once. `test_split`: the split `test` names;
    `chunk_size`: pairs read, encoded and written at a time; `stop`: the reason to stop politely,
    or None to go on, asked between chunks and while waiting for the lock (raises `Stopped`);
    `budget`: the same for a time budget, asked between chunks only, so that under DDP a rank
    whose own clock runs out while another rank builds never leaves that one waiting for it (the
    builder stops by its budget; each waiter then takes the lock and stops at its first chunk)."""
    source = resolve_corpus(cfg.dataset, cfg.data_dir)
    names = split_names(source, test_split)
    key = _cache_key(cfg, source, names["train"])
    try:
        ready = _complete(cfg, source, names, key)
    except DamagedSplit as damaged:  # rebuilt below, under the lock
        _log(f"{damaged.folder}: damaged ({damaged.problem}); rebuilding it")
        ready = None
    if ready is not None:  # the usual case once prepared: no lock, so read-only caches work too
        return ready
    with exclusive(_lock_path(cfg, key), _log, stop):
        try:  # another process may have built it while this one waited
            ready = _complete(cfg, source, names, key)
        except DamagedSplit:
            ready = None
        if ready is not None:
            return ready
        building = _first_reason(stop, budget)
        tokenizer = _tokenizer(cfg, source, names["train"], key, chunk_size, building)
        for role, split in names.items():
            path = _split_path(cfg, source, split, tokenizer)
            workers = (cfg.prepare_workers or cores()) if role == "train" else 1
            if path.exists():  # whole, or damaged: built again
                try:
                    checked_meta(path)
                    continue
                except DamagedSplit:
                    shutil.rmtree(path)
            _encode_split(cfg, source, split, tokenizer, path, (workers, chunk_size), building)
    ready = _complete(cfg, source, names, key)
    if ready is None:  # cannot happen with a working lock; say so rather than fail obscurely
        raise UserError(f"`cache_dir` {cfg.cache_dir}: the cache changed while it was being built")
    ready.built = True  # complete now: this process built it
    return ready


def _first_reason(*asks: Callable[[], str | None] | None) -> Callable[[], str | None]:
    """One question for several: the first reason any of `asks` gives (None: go on)."""

    def ask() -> str | None:
        reasons = (ask() for ask in asks if ask is not None)
        return next((reason for reason in reasons if reason is not None), None)

    return ask


def cache_lock(cfg: DataConfig) -> Path:
    """The lock file that the builder of `cfg`'s cache holds (the others wait on it)."""
    source = resolve_corpus(cfg.dataset, cfg.data_dir)
    return _lock_path(cfg, _cache_key(cfg, source, source.find_split("train")))


def _cache_key(cfg: DataConfig, source: CorpusSource, train: str) -> str:
    langs = sorted((cfg.src, cfg.tgt))  # the joint model serves both directions
    return _safe(
        f"{source.name}-{'-'.join(langs)}-{cfg.limit_train_pairs or 'all'}-"
        f"{source.fingerprint(train, tuple(langs))}"
    )


def _lock_path(cfg: DataConfig, key: str) -> Path:
    return Path(cfg.cache_dir) / f"{key}.lock"


def split_names(source: CorpusSource, test_split: str | None = None) -> dict[str, str]:
    """The corpus's names for train, val and (when there is one, or when asked for) test."""
    names = {"train": source.find_split("train"), "val": source.find_split("val")}
    try:
        names["test"] = source.find_split(test_split or "test")
    except UserError:
        if test_split:  # asked for by name: its absence is an error; else no test split
            raise
    return names


def _complete(
    cfg: DataConfig, source: CorpusSource, names: dict[str, str], key: str
) -> Prepared | None:
    """The cache when all of it is there, else None."""
    file = Path(cfg.spm_model) if cfg.spm_model is not None else _spm_path(cfg, key)
    if cfg.spm_model is None and not file.exists():
        return None
    tokenizer = _given_tokenizer(file) if cfg.spm_model else load_tokenizer(file)
    paths = {role: _split_path(cfg, source, split, tokenizer) for role, split in names.items()}
    if not all((p / "meta.json").exists() for p in paths.values()):
        return None
    # The shards' digests too: a block changed in place keeps the size, and is rebuilt like any
    # other damage rather than refused at every start (hashing costs a read of the cache).
    meta = {role: checked_meta(p) for role, p in paths.items()}
    return Prepared(tokenizer, file, paths, names, source.location, meta)


def _spm_key(cfg: DataConfig, key: str) -> str:
    return f"{key}-s{cfg.spm_sample}-r{cfg.seed}"  # the sample depends on its size and seed


def _spm_path(cfg: DataConfig, key: str) -> Path:
    return tokenizer_path(cfg.cache_dir, _spm_key(cfg, key), cfg.vocab_size)


def _given_tokenizer(path: str | Path) -> Tokenizer:
    try:
        return Tokenizer.from_bytes(Path(path).read_bytes())
    except OSError as err:
        raise UserError(f"`spm_model` {path}: cannot read it ({err.strerror})") from None
    except UserError as err:
        raise UserError(f"`spm_model` {path}: {err}") from None


def _tokenizer(
    cfg: DataConfig,
    source: CorpusSource,
    train: str,
    key: str,
    chunk_size: int,
    stop: Callable[[], str | None] | None = None,
) -> Tokenizer:
    """`spm_model` as given, or the cached model, or one trained on a sample and cached."""
    if cfg.spm_model is not None:
        return _given_tokenizer(cfg.spm_model)

    def sample() -> Iterator[str]:
        chunks = stream_pairs(source, train, cfg.src, cfg.tgt, cfg.limit_train_pairs, chunk_size)
        bar = _progress(chunks, train, f"sampling {cfg.spm_sample:,} sentences of", stop)
        texts = sample_sentences((c.src + c.tgt for c in bar), cfg.spm_sample, cfg.seed)
        if not texts:  # refused here, in plain Python, rather than by sentencepiece's trainer
            raise UserError(f"{source.location}: the training split {train!r} has no pairs")
        _log(f"training sentencepiece on {len(texts):,} sentences ({TRAIN_THREADS} threads)")
        return _handed_over(texts)

    start = time.perf_counter()
    tokenizer = load_or_train_tokenizer(
        Path(cfg.cache_dir), sample, cfg.vocab_size, _spm_key(cfg, key), sample=cfg.spm_sample
    )
    _log(f"tokenizer ready in {time.perf_counter() - start:.1f} s, sampling included")
    return tokenizer


def _handed_over(texts: list[str]) -> Iterator[str]:
    """The sentences one by one, each dropped from `texts` once given: sentencepiece keeps a copy."""
    while texts:
        yield texts.pop()


def _split_path(cfg: DataConfig, source: CorpusSource, split: str, tok: Tokenizer) -> Path:
    train = split == source.find_split("train")
    limit = cfg.limit_train_pairs if train else None
    model = hashlib.sha1(tok.to_bytes()).hexdigest()[:8]
    fingerprint = source.fingerprint(split, (cfg.src, cfg.tgt))
    name = f"{source.name}-{cfg.src}-{cfg.tgt}-{split}-{limit or 'all'}-{fingerprint}-{model}"
    name += links_suffix(cfg.guided_alignment if train else None)  # "" unless guided
    return Path(cfg.cache_dir) / "encoded" / f"{_safe(name)}-f{FORMAT}"


def _encode_split(
    cfg: DataConfig,
    source: CorpusSource,
    split: str,
    tok: Tokenizer,
    path: Path,
    sizes: tuple[int, int],
    stop: Callable[[], str | None] | None = None,
) -> None:
    """Encode `split` into `path` (shards + meta.json), all or nothing: a temporary folder, renamed.
    `sizes`: the processes that encode and the pairs they take at a time; `stop`: see `prepare`."""
    workers, chunk_size = sizes
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_orphans(path, _log)  # never another machine's: its builder may be at work
    tmp = temporary_name(path)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    train = split == source.find_split("train")  # the other splits keep their raw sentences
    dtype = np.uint16 if tok.vocab_size <= 2**16 else np.uint32
    guided = train and cfg.guided_alignment is not None
    schema = split_schema(dtype, text=not train, links=guided)
    limit = cfg.limit_train_pairs if train else None
    chunks = None
    try:
        pairs = stream_pairs(source, split, cfg.src, cfg.tgt, limit, chunk_size)
        chunks = _progress(pairs, split, stop=stop)
        job = encode_with_links if guided else None  # ids and links from the same offsets
        if guided:  # the alignment file is read alongside, one chunk's lines at a time
            chunks = attach_links(chunks, cfg.guided_alignment, limit is not None)
        chunks = encode_chunks(chunks, tok, workers, dtype, job)
        start, cpu, rows, empty, fill = time.perf_counter(), _cpu(), 0, 0, 0
        digest = hashlib.sha1()  # of the pairs as read: a resume checks it is the same corpus
        shards: list[str] = []
        shard_rows: list[int] = []
        writer = None
        try:
            for chunk, ids in chunks:
                if writer is None or fill >= SHARD_PAIRS:
                    writer, fill = next_shard(writer, tmp, shards, schema), 0
                    shard_rows.append(0)
                writer.write_batch(record_batch(chunk, ids, rows, schema))
                for side in (chunk.src, chunk.tgt):
                    digest.update("\n".join(side).encode() + b"\0")
                rows, empty, fill = rows + len(chunk), empty + chunk.empty, fill + len(chunk)
                shard_rows[-1] += len(chunk)
            if writer is None:  # an empty split: one empty shard
                writer = next_shard(None, tmp, shards, schema)
                shard_rows.append(0)
            writer.close()
            sizes = [fsynced(tmp / name) for name in shards]
            digests = [shard_digest(tmp / name) for name in shards]  # checked when opened
            seconds = time.perf_counter() - start
            meta = {"rows": rows, "empty": empty, "shards": shards, "shard_rows": shard_rows,
                    "shard_bytes": sizes, "shard_sha256": digests, "sha1": digest.hexdigest(),
                    "seconds": round(seconds, 1)}  # fmt: skip
            atomic_write_text(tmp / "meta.json", json.dumps(meta))
            fsync_folder(tmp)  # the folder's entries reach the disk before its new name does
        except OSError as err:  # a full disk, a quota, `ulimit -f`: nothing is published
            raise UserError(
                f"`cache_dir` {cfg.cache_dir}: cannot write the encoded split {split!r} "
                f"({write_reason(err)})"
            ) from None
        try:
            os.replace(tmp, path)  # all or nothing
        except OSError:  # a builder on another machine (a lock that did not reach it) was first
            if not (path / "meta.json").exists():
                raise
        fsync_folder(path.parent)
    finally:
        if chunks is not None:  # a stop or an error: the workers end before the folder goes
            chunks.close()
        shutil.rmtree(tmp, ignore_errors=True)
    rate = f"{rows / max(seconds, 1e-9):,.0f} pairs/s, {workers} proc, {_cpu() - cpu:.0f} CPU s"
    _log(f"encoded {split}: {rows:,} pairs in {seconds:.1f} s ({rate})")


def _progress(
    chunks: Iterator[Pairs],
    split: str,
    what: str = "encoding",
    stop: Callable[[], str | None] | None = None,
) -> Iterator[Pairs]:
    """`chunks` counted on a progress bar; a polite stop (`stop`, see `prepare`) is asked before
    each is given."""
    from tqdm import tqdm

    # disable=None: a bar on a terminal; logs (SLURM, CI, captured stderr) get `_log`'s pairs/s line.
    bar = tqdm(desc=f"{what} {split}", unit=" pairs", unit_scale=True, mininterval=2, disable=None)
    try:
        for chunk in chunks:
            check_stop(stop)
            yield chunk
            bar.update(len(chunk) + chunk.empty)
    except BaseException:
        bar.leave = False  # a refused corpus leaves its one-line error alone on the screen
        raise
    finally:
        bar.close()


def _log(message: str) -> None:
    print(f"prepare: {message}", file=sys.stderr, flush=True)


def _cpu() -> float:
    """CPU seconds of this process and of its children that have ended (encoding workers)."""
    usage = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return sum(u.ru_utime + u.ru_stime for u in usage)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)
