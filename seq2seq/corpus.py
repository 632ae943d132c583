"""Find a parallel corpus by name and stream the raw sentence pairs of one split in chunks.

Resolution order: `data/<name>/` (current directory), then `<repo>/../shared/data/<name>/` (the offline
mirror beside every checkout), then the Hugging Face hub. A local folder holds `<split>.<lang>` files
(plain or `.gz`, line-aligned) or tables laid out as on the hub: `<split>.{tsv,jsonl}[.gz]` or
`<split>.parquet`, maybe sharded (`<split>-00000-of-00004.parquet`) and maybe under `data/`, with flat
language columns or a `translation` column. Nothing is read whole: always `chunk_size` pairs at a time.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import islice, zip_longest
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

import seq2seq
from seq2seq.errors import UserError

SHARED_DATA = Path(seq2seq.__file__).resolve().parents[1].parent / "shared" / "data"
HUB_IDS = {"multi30k": "bentrevett/multi30k"}
CHUNK_PAIRS = 10_000  # pairs per chunk: a few MB of text, enough to amortise per-chunk work
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
            return _schema_langs(self.hub[split].features.arrow_schema)
        files = self._files[split]
        table = next((k for k in _TABLES if k in files), None) if len(files) == 1 else None
        if table == "tsv":
            fields = next(_lines(files["tsv"][0], size=1), [""])[0].split("\t")
            header = len(fields) >= 2 and all(_LANG.fullmatch(f.strip()) for f in fields)
            return sorted(fields) if header else None
        if table == "jsonl":
            first = next(_lines(files["jsonl"][0], size=1), [])
            return sorted(_json_row(files["jsonl"][0], 1, first[0])) if first else []
        if table == "parquet":
            return _schema_langs(pq.read_schema(files["parquet"][0]))
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
    for folder in (Path("data") / name, SHARED_DATA / name):
        if folder.is_dir():
            return CorpusSource(name, str(folder), folder=folder)
        searched.append(str(folder.absolute()))
    hub_id = HUB_IDS.get(name, name)
    try:
        import datasets  # heavy import, only needed on this path

        hub = datasets.load_dataset(*hub_id.split(":", 1))  # "wmt14:de-en" names a config
    except Exception as err:  # offline, unreachable, unknown id: all end the same way for a user
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UserError(
            f"corpus {name!r} not found: searched {', '.join(searched)} "
            f"and the Hugging Face hub as {hub_id!r} ({reason})"
        ) from None
    return CorpusSource(name, f"hub:{hub_id}", hub=hub)


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
        raw = (_arrow_columns(b, src_lang, tgt_lang) for b in batches)
    else:
        raw = _local_columns(source._files[split], src_lang, tgt_lang, langs is None, chunk_size)
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


def _local_columns(
    files: dict[str, list[Path]], src_lang: str, tgt_lang: str, positional: bool, size: int
) -> Iterator[tuple[list[str], list[str]]]:
    if src_lang in files and tgt_lang in files:
        (src_path,), (tgt_path,) = files[src_lang], files[tgt_lang]
        n = [0, 0]  # lines so far; once one file has ended, the rest of the other is only counted
        for src, tgt in zip_longest(_lines(src_path, size), _lines(tgt_path, size), fillvalue=[]):
            if n[0] == n[1] and len(src) == len(tgt):
                yield src, tgt
            n = [n[0] + len(src), n[1] + len(tgt)]
        if n[0] != n[1]:
            raise UserError(f"{src_path} has {n[0]} lines but {tgt_path} has {n[1]}")
    elif "tsv" in files or "jsonl" in files:
        kind = "tsv" if "tsv" in files else "jsonl"
        yield from _table_columns(files[kind], kind, src_lang, tgt_lang, positional, size)
    else:
        for path in files["parquet"]:
            for batch in pq.ParquetFile(path).iter_batches(batch_size=size):
                yield _arrow_columns(batch, src_lang, tgt_lang)


def _table_columns(
    paths: list[Path], kind: str, src_lang: str, tgt_lang: str, positional: bool, size: int
) -> Iterator[tuple[list[str], list[str]]]:
    """TSV or JSON Lines shards, row by row; the header of each TSV shard names its columns."""
    for path in paths:
        cols, width, number = [0, 1], 2, 0
        for lines in _lines(path, size):
            rows = []
            for line in lines:
                number += 1
                if not line.strip():
                    pair = ("", "")
                elif kind == "jsonl":
                    row = _json_row(path, number, line, (src_lang, tgt_lang))
                    pair = (str(row[src_lang] or ""), str(row[tgt_lang] or ""))
                else:
                    fields = line.split("\t")
                    if number == 1 and not positional:  # the header row
                        cols, width = [fields.index(k) for k in (src_lang, tgt_lang)], len(fields)
                        continue
                    if len(fields) != width:
                        raise UserError(
                            f"{path} line {number}: {len(fields)} tab-separated columns, not {width}"
                        )
                    pair = (fields[cols[0]], fields[cols[1]])
                rows.append(pair)
            yield [s for s, _ in rows], [t for _, t in rows]


def _arrow_columns(batch: Any, src_lang: str, tgt_lang: str) -> tuple[list, list]:
    """Two columns of an Arrow table or batch as lists (None for nulls), never dicts per row."""
    if "translation" in batch.schema.names:
        pairs = batch.column("translation")
        return pc.struct_field(pairs, src_lang).to_pylist(), pc.struct_field(
            pairs, tgt_lang
        ).to_pylist()
    return batch.column(src_lang).to_pylist(), batch.column(tgt_lang).to_pylist()


def _schema_langs(schema: pa.Schema) -> list[str]:
    if "translation" in schema.names and pa.types.is_struct(schema.field("translation").type):
        return sorted(f.name for f in schema.field("translation").type)
    return sorted(f.name for f in schema if f.type in (pa.string(), pa.large_string()))


def read_lines(path: str | Path) -> list[str]:
    """Lines of a UTF-8 file (plain or gzip), split on '\\n' only: U+2028 cannot break alignment."""
    return [line for chunk in _lines(Path(path)) for line in chunk]


def _lines(path: Path, size: int = CHUNK_PAIRS) -> Iterator[list[str]]:
    """The lines of `path` (without '\\n', '\\r\\n' or a byte-order mark), `size` at a time."""
    number = 0
    try:
        with gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb") as file:
            while raw := b"".join(islice(file, size)).removeprefix(b"\xef\xbb\xbf" * (number == 0)):
                try:  # one decode per chunk: UTF-8 never hides a 0x0a byte inside a character
                    text = raw.decode("utf-8")
                except UnicodeDecodeError as err:
                    line = number + raw.count(b"\n", 0, err.start) + 1
                    raise UserError(
                        f"{path} line {line}: not valid UTF-8 (byte 0x{raw[err.start]:02x})"
                    ) from None
                lines = text.removesuffix("\n").split("\n")  # a final newline starts no line
                yield [line.removesuffix("\r") for line in lines] if "\r" in text else lines
                number += len(lines)
    except (OSError, EOFError, zlib.error) as err:
        raise UserError(f"{path}: cannot read ({err})") from None


def _json_row(path: Path, number: int, line: str, need: tuple[str, ...] = ()) -> dict[str, Any]:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as err:
        raise UserError(f"{path} line {number}: not valid JSON ({err.msg})") from None
    if isinstance(row, dict) and isinstance(row.get("translation"), dict):
        row = row["translation"]
    if not isinstance(row, dict):
        raise UserError(f"{path} line {number}: expected a JSON object keyed by language")
    if any(lang not in row for lang in need):
        raise UserError(
            f"{path} line {number}: no {'/'.join(map(repr, need))} (has: {sorted(row)})"
        )
    return row
