"""Find a parallel corpus by name and stream the raw sentence pairs of one split in chunks.

Resolution order, for a corpus named `name` (unless `--data-dir` names its folder): `<dir>/<name>/`
for each folder `<dir>` of the environment variable SEQ2SEQ_DATA (separated by `os.pathsep`), then
`data/<name>/` and `../shared/data/<name>/`, both relative to the current folder (the second is the
offline mirror beside a checkout, found when a command runs from the checkout's root), then the
Hugging Face hub. The package itself assumes no folder around it. A local folder holds `<split>.<lang>` files
(plain or `.gz`, line-aligned) or tables laid out as on the hub: `<split>.{tsv,jsonl}[.gz]` or
`<split>.parquet`, maybe sharded (`<split>-00000-of-00004.parquet`) and maybe under `data/`, with flat
language columns or a `translation` column. Nothing is read whole: always `chunk_size` pairs at a time
(the readers of each format are in seq2seq.data.corpus_files).
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pyarrow.parquet as pq

from seq2seq.data.corpus_files import (
    CHUNK_PAIRS,
    arrow_columns,
    json_row,
    local_columns,
    read_lines,
    schema_langs,
    text_lines,
)
from seq2seq.errors import UserError

__all__ = [  # read_lines and CHUNK_PAIRS are imported from here by the scripts and the preparation
    "CHUNK_PAIRS",
    "CorpusSource",
    "Pairs",
    "read_lines",
    "read_pairs",
    "resolve_corpus",
    "stream_pairs",
]

DATA_ENV = "SEQ2SEQ_DATA"  # folders of corpora by name, searched first
LOCAL_DATA = Path("data")  # relative to the current folder
SHARED_DATA = Path("..", "shared", "data")  # relative to it too: the mirror beside a checkout
HUB_IDS = {"multi30k": "bentrevett/multi30k"}
# One split, many spellings across corpora; `test` is Multi30k's test_2016_flickr where there is one.
_SPLIT_ALIASES = (("val", "validation", "valid", "dev"), ("test", "test_2016_flickr"))
_LANG = re.compile(r"[A-Za-z]{2,3}(?:[-_][A-Za-z0-9]{2,8})?")
_NOT_LANG = {"md", "txt", "py", "cfg", "ini", "log", "lock", "tmp", "csv", "json", "yml", "model"}
_TABLES = ("tsv", "jsonl", "parquet")
_SHARD = re.compile(r"-\d+-of-\d+$")  # hub shard suffix: train-00000-of-00004.parquet


@dataclass
class Pairs:
    """Line-aligned raw sentences of a split or chunk; `empty` counts pairs dropped as blank;
    `kept`: in a chunk of `stream_pairs`, the row of each pair among the chunk's len + empty rows
    (what lines up a file of one line per row, such as word alignments, with the pairs)."""

    src: list[str]
    tgt: list[str]
    empty: int = 0
    kept: list[int] | None = None

    def __len__(self) -> int:
        return len(self.src)


@dataclass
class CorpusSource:
    """A resolved corpus: a local folder (`folder`) or a loaded hub `DatasetDict` (`hub`)."""

    name: str
    location: str
    folder: Path | None = None
    hub: Any = None
    _files: dict[str, dict[str, list[Path]]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.folder is None:
            return
        for path in sorted(self.folder.iterdir()) + sorted(self.folder.glob("data/*")):
            stem, dot, ext = path.name.removesuffix(".gz").rpartition(".")
            if not (path.is_file() and dot and stem) or path.name.startswith("."):
                continue
            if ext in _TABLES:
                self._files.setdefault(_SHARD.sub("", stem), {}).setdefault(ext, []).append(path)
            elif _LANG.fullmatch(ext) and ext.lower() not in _NOT_LANG:
                self._files.setdefault(stem, {})[ext] = [path]
        if not self._files:
            raise UserError(f"{self.folder} holds no <split>.<lang>[.gz] files or tables")

    def splits(self) -> list[str]:
        return sorted(self.hub) if self.hub is not None else sorted(self._files)

    def find_split(self, split: str) -> str:
        """The name `split` has here (`val` may be `validation`, `test` Multi30k's `test_2016_flickr`)."""
        known = self.splits()
        group = next((g for g in _SPLIT_ALIASES if split in g), ())
        found = next((alias for alias in (split, *group) if alias in known), None)
        if found is not None:
            return found
        raise UserError(f"{self.location} has no split {split!r} (it has: {', '.join(known)})")

    def langs(self, split: str) -> list[str] | None:
        """Languages of `split`; None for a header-less TSV, whose two columns are src and tgt."""
        if self.hub is not None:
            return schema_langs(self.hub[split].features.arrow_schema)
        files = self._files[split]
        table = next((k for k in _TABLES if k in files), None) if len(files) == 1 else None
        if table == "tsv":
            fields = next(text_lines(files["tsv"][0], size=1), [""])[0].split("\t")
            header = len(fields) >= 2 and all(_LANG.fullmatch(f.strip()) for f in fields)
            return sorted(fields) if header else None
        if table == "jsonl":
            first = next(text_lines(files["jsonl"][0], size=1), [])
            return sorted(json_row(files["jsonl"][0], 1, first[0])) if first else []
        if table == "parquet":
            return schema_langs(pq.read_schema(files["parquet"][0]))
        return sorted(k for k in files if k not in _TABLES)

    def fingerprint(self, split: str, langs: tuple[str, ...]) -> str:
        """8 hex digits that change when the data behind (`split`, `langs`) changes."""
        if self.hub is not None:
            parts = [self.location, self.hub[split]._fingerprint]
        else:
            files = self._files[split]
            paths = [p for k in langs if k in files for p in files[k]]
            paths = paths or [p for ps in files.values() for p in ps]
            parts = [f"{p.resolve()}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in paths]
        return hashlib.sha1("|".join(parts).encode()).hexdigest()[:8]


def resolve_corpus(name: str, data_dir: str | None = None) -> CorpusSource:
    """Find corpus `name` (or use `data_dir`); see the module docstring for the order."""
    if data_dir is not None:
        folder = Path(data_dir)
        if not folder.is_dir():
            raise UserError(f"`data_dir` {data_dir}: no such folder")
        return CorpusSource(folder.resolve().name, str(folder), folder=folder)
    searched = []
    for folder in corpus_folders(name):
        if folder.is_dir():
            return CorpusSource(name, str(folder), folder=folder)
        searched.append(str(folder.absolute()))
    hub_id = HUB_IDS.get(name, name)
    cache_only = hub_out_of_reach()
    try:
        import datasets  # heavy import, only needed on this path

        hub = datasets.load_dataset(*hub_id.split(":", 1))  # "wmt14:de-en" names a config
    except Exception as err:  # offline, unreachable, unknown id: all end the same way for a user
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        where = "the Hugging Face hub's cache" if cache_only else "the Hugging Face hub"
        why = f"{cache_only}: {reason}" if cache_only else reason
        raise UserError(
            f"corpus {name!r} not found: searched {', '.join(searched)} and {where} as {hub_id!r} "
            f"({why})"
        ) from None
    return CorpusSource(name, f"hub:{hub_id}", hub=hub)


def hub_out_of_reach() -> str | None:
    """Why the hub cannot be reached (its host does not resolve: no network), else None. Then
    `datasets` is imported offline and reads its cache alone at once, instead of retrying the hub for
    half a minute first; an offline setting of the user's is left as it is."""
    offline = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    if "datasets" in sys.modules or any(v in os.environ for v in offline):
        return None
    host = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co").hostname or ""
    try:
        socket.getaddrinfo(host, 443)
    except (OSError, UnicodeError):  # socket.gaierror is an OSError
        os.environ["HF_HUB_OFFLINE"] = "1"
        return f"{host} does not resolve"
    return None


def corpus_folders(name: str) -> list[Path]:
    """Where a corpus named `name` is looked for, in order (the module docstring's list)."""
    listed = [Path(d) for d in os.environ.get(DATA_ENV, "").split(os.pathsep) if d]
    shared = Path(os.path.abspath(SHARED_DATA / name))  # absolute, as before: its location is shown
    return [*(d / name for d in listed), LOCAL_DATA / name, shared]


def read_pairs(
    source: CorpusSource, split: str, src_lang: str, tgt_lang: str, limit: int | None = None
) -> Pairs:
    """All raw, stripped, non-empty pairs of `split` in memory; `limit` keeps the first N pairs.
    For small splits (evaluation); the training data goes through `stream_pairs`."""
    chunks = list(stream_pairs(source, split, src_lang, tgt_lang, limit))
    src, tgt = [s for c in chunks for s in c.src], [t for c in chunks for t in c.tgt]
    return Pairs(src, tgt, sum(c.empty for c in chunks))


def stream_pairs(
    source: CorpusSource,
    split: str,
    src_lang: str,
    tgt_lang: str,
    limit: int | None = None,
    chunk_size: int = CHUNK_PAIRS,
) -> Iterator[Pairs]:
    """Stripped, non-empty pairs of `split` in chunks of `chunk_size` rows; the first `limit` only."""
    if src_lang == tgt_lang:
        raise UserError(f"`src` and `tgt` are both {src_lang!r}")
    split = source.find_split(split)
    langs = source.langs(split)
    for lang in (src_lang, tgt_lang):
        if langs is not None and lang not in langs:
            raise UserError(
                f"{source.location} split {split!r} has no language {lang!r} "
                f"(it has: {', '.join(langs)})"
            )
    if source.hub is not None:
        batches = source.hub[split].with_format("arrow").iter(batch_size=chunk_size)
        raw = (arrow_columns(b, src_lang, tgt_lang) for b in batches)
    else:
        raw = local_columns(source._files[split], src_lang, tgt_lang, langs is None, chunk_size)
    return _clean(raw, limit)


def _clean(raw: Iterator[tuple[list, list]], limit: int | None) -> Iterator[Pairs]:
    left = limit or 1 << 62
    for src, tgt in raw:
        src, tgt = [(s or "").strip() for s in src], [(t or "").strip() for t in tgt]
        keep = [i for i, (s, t) in enumerate(zip(src, tgt, strict=True)) if s and t][:left]
        rows = keep[-1] + 1 if len(keep) == left else len(src)  # the limit may end the chunk early
        if rows:
            yield Pairs([src[i] for i in keep], [tgt[i] for i in keep], rows - len(keep), keep)
        left -= len(keep)
        if left == 0:
            return
