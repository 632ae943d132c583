"""Find a parallel corpus by name and read the raw sentence pairs of one split.

Resolution order: `data/<name>/` (current directory), then `<repo>/../shared/data/<name>/` (the offline
mirror beside every checkout), then the Hugging Face hub. A local folder holds `<split>.<lang>` files
(plain or `.gz`, line-aligned), or one `<split>.tsv` / `<split>.jsonl` per split.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import seq2seq
from seq2seq.errors import UserError

SHARED_DATA = Path(seq2seq.__file__).resolve().parents[1].parent / "shared" / "data"
HUB_IDS = {"multi30k": "bentrevett/multi30k"}
# One split, many spellings across corpora; `test` is Multi30k's test_2016_flickr where there is one.
_SPLIT_ALIASES = (("val", "validation", "valid", "dev"), ("test", "test_2016_flickr"))
_LANG = re.compile(r"[A-Za-z]{2,3}(?:[-_][A-Za-z0-9]{2,8})?")
_NOT_LANG = {"md", "txt", "py", "cfg", "ini", "log", "lock", "tmp", "csv", "json", "yml", "model"}
_TABLES = ("tsv", "jsonl")


@dataclass
class Pairs:
    """Line-aligned raw sentences of one split; `empty` counts the pairs dropped as blank."""

    src: list[str]
    tgt: list[str]
    empty: int = 0

    def __len__(self) -> int:
        return len(self.src)


@dataclass
class CorpusSource:
    """A resolved corpus: a local folder (`folder`) or a loaded hub `DatasetDict` (`hub`)."""

    name: str
    location: str
    folder: Path | None = None
    hub: Any = None
    _files: dict[str, dict[str, Path]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.folder is None:
            return
        for path in sorted(self.folder.iterdir()):
            stem = path.name.removesuffix(".gz")
            split, dot, ext = stem.rpartition(".")
            if not (path.is_file() and dot and split) or path.name.startswith("."):
                continue
            if ext in _TABLES or (_LANG.fullmatch(ext) and ext.lower() not in _NOT_LANG):
                self._files.setdefault(split, {})[ext] = path
        if not self._files:
            raise UserError(f"{self.folder} holds no <split>.<lang>[.gz], .tsv or .jsonl files")

    def splits(self) -> list[str]:
        return sorted(self.hub) if self.hub is not None else sorted(self._files)

    def find_split(self, split: str) -> str:
        """The name `split` has here (`val` may be `validation`, `test` Multi30k's `test_2016_flickr`)."""
        known = self.splits()
        if split in known:
            return split
        for group in _SPLIT_ALIASES:
            if split in group:
                for alias in group:
                    if alias in known:
                        return alias
        raise UserError(f"{self.location} has no split {split!r} (it has: {', '.join(known)})")

    def langs(self, split: str) -> list[str] | None:
        """Languages of `split`; None for a header-less TSV, whose two columns are src and tgt."""
        if self.hub is not None:
            features = self.hub[split].features
            if "translation" in features:
                langs = getattr(features["translation"], "languages", None)
                return sorted(langs or self.hub[split][0]["translation"])
            return sorted(k for k, v in features.items() if getattr(v, "dtype", "") == "string")
        files = self._files[split]
        if "tsv" in files and len(files) == 1:
            header = read_lines(files["tsv"], limit=1)
            fields = header[0].split("\t") if header else []
            return sorted(fields) if _is_header(fields) else None
        if "jsonl" in files and len(files) == 1:
            first = read_lines(files["jsonl"], limit=1)
            row = _json_row(files["jsonl"], 1, first[0]) if first else {}
            return sorted(row)
        return sorted(k for k in files if k not in _TABLES)

    def fingerprint(self, split: str, langs: tuple[str, ...]) -> str:
        """8 hex digits that change when the data behind (`split`, `langs`) changes."""
        if self.hub is not None:
            parts = [self.location, self.hub[split]._fingerprint]
        else:
            files = self._files[split]
            paths = [files[k] for k in langs if k in files] or list(files.values())
            parts = [f"{p.resolve()}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in paths]
        return hashlib.sha1("|".join(parts).encode()).hexdigest()[:8]


def resolve_corpus(name: str, data_dir: str | None = None) -> CorpusSource:
    """Find corpus `name` (or use `data_dir`); see the module docstring for the order."""
    if data_dir is not None:
        folder = Path(data_dir)
        if not folder.is_dir():
            raise UserError(f"--data-dir {data_dir}: no such folder")
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
    """Raw, stripped, non-empty pairs of `split`; `limit` keeps the first N pairs."""
    if src_lang == tgt_lang:
        raise UserError(f"--src and --tgt are both {src_lang!r}")
    split = source.find_split(split)
    langs = source.langs(split)
    for lang in (src_lang, tgt_lang):
        if langs is not None and lang not in langs:
            raise UserError(
                f"{source.location} split {split!r} has no language {lang!r} "
                f"(it has: {', '.join(langs)})"
            )
    if source.hub is not None:
        src, tgt = _hub_columns(source.hub[split], src_lang, tgt_lang)
    else:
        src, tgt = _local_columns(source._files[split], src_lang, tgt_lang, langs is None)
    pairs = Pairs([], [])
    for s, t in zip(src, tgt, strict=True):
        s, t = (s or "").strip(), (t or "").strip()
        if not s or not t:
            pairs.empty += 1
        elif limit is None or len(pairs) < limit:
            pairs.src.append(s)
            pairs.tgt.append(t)
    return pairs


def _local_columns(
    files: dict[str, Path], src_lang: str, tgt_lang: str, positional: bool
) -> tuple[list[str], list[str]]:
    if src_lang in files and tgt_lang in files:
        src, tgt = read_lines(files[src_lang]), read_lines(files[tgt_lang])
        if len(src) != len(tgt):
            raise UserError(
                f"{files[src_lang]} has {len(src)} lines but {files[tgt_lang]} has {len(tgt)}"
            )
        return src, tgt
    if "tsv" in files:
        path, lines = files["tsv"], read_lines(files["tsv"])
        cols = (
            [0, 1] if positional else [lines[0].split("\t").index(k) for k in (src_lang, tgt_lang)]
        )
        width = 2 if positional else len(lines[0].split("\t"))
        src, tgt = [], []
        for number, line in enumerate(lines, start=1):
            if not positional and number == 1:
                continue  # the header row
            fields = line.split("\t")
            if len(fields) != width and line.strip():
                raise UserError(
                    f"{path} line {number}: {len(fields)} tab-separated columns, not {width}"
                )
            src.append(fields[cols[0]] if line.strip() else "")
            tgt.append(fields[cols[1]] if line.strip() else "")
        return src, tgt
    path, src, tgt = files["jsonl"], [], []
    for number, line in enumerate(read_lines(path), start=1):
        row = _json_row(path, number, line) if line.strip() else {src_lang: "", tgt_lang: ""}
        if src_lang not in row or tgt_lang not in row:
            raise UserError(
                f"{path} line {number}: no {src_lang!r}/{tgt_lang!r} (has: {sorted(row)})"
            )
        src.append(str(row[src_lang] or ""))
        tgt.append(str(row[tgt_lang] or ""))
    return src, tgt


def _hub_columns(dataset: Any, src_lang: str, tgt_lang: str) -> tuple[list[str], list[str]]:
    if "translation" in dataset.column_names:
        rows = dataset.select_columns(["translation"]).to_dict()["translation"]
        return [r[src_lang] for r in rows], [r[tgt_lang] for r in rows]
    columns = dataset.select_columns([src_lang, tgt_lang]).to_dict()
    return columns[src_lang], columns[tgt_lang]


def read_lines(path: str | Path, limit: int | None = None) -> list[str]:
    """Lines of a UTF-8 file (plain or gzip), split on '\\n' only so that U+2028 and friends
    inside a sentence cannot break line alignment."""
    path = Path(path)
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError, zlib.error) as err:
        raise UserError(f"{path}: cannot read ({err})") from None
    raw = raw.removeprefix(b"\xef\xbb\xbf")  # a UTF-8 byte-order mark is not part of line 1
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        raise UserError(
            f"{path} line {line}: not valid UTF-8 (byte 0x{raw[err.start]:02x})"
        ) from None
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # the final newline ends the last line; it does not start a new one
    return [line.removesuffix("\r") for line in lines[:limit]]


def _is_header(fields: list[str]) -> bool:
    return len(fields) >= 2 and all(_LANG.fullmatch(f.strip()) for f in fields)


def _json_row(path: Path, number: int, line: str) -> dict[str, Any]:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as err:
        raise UserError(f"{path} line {number}: not valid JSON ({err.msg})") from None
    if isinstance(row, dict) and isinstance(row.get("translation"), dict):
        row = row["translation"]
    if not isinstance(row, dict):
        raise UserError(f"{path} line {number}: expected a JSON object keyed by language")
    return row
