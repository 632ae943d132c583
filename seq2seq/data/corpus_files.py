"""Reading the files a corpus comes in, `size` rows at a time: line-aligned text (plain or gzip),
TSV with or without a header row, JSON Lines, Parquet and Arrow tables (flat language columns or a
`translation` column). seq2seq.data.corpus finds the files and turns these columns into sentence pairs.

Every reader turns what is wrong with a file into a UserError naming the file and the line: invalid
UTF-8, a TSV row of the wrong width, a JSON line that is not an object keyed by language.
"""

import gzip
import json
import zlib
from collections.abc import Iterator
from itertools import islice, zip_longest
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from seq2seq.errors import UserError

CHUNK_PAIRS = 10_000  # pairs per chunk: a few MB of text, enough to amortise per-chunk work


def local_columns(
    files: dict[str, list[Path]], src_lang: str, tgt_lang: str, positional: bool, size: int
) -> Iterator[tuple[list[str], list[str]]]:
    if src_lang in files and tgt_lang in files:
        (src_path,), (tgt_path,) = files[src_lang], files[tgt_lang]
        n = [0, 0]  # lines so far; once one file has ended, the rest of the other is only counted
        for src, tgt in zip_longest(
            text_lines(src_path, size), text_lines(tgt_path, size), fillvalue=[]
        ):
            if n[0] == n[1] and len(src) == len(tgt):
                yield src, tgt
            n = [n[0] + len(src), n[1] + len(tgt)]
        if n[0] != n[1]:
            raise UserError(f"{src_path} has {n[0]} lines but {tgt_path} has {n[1]}")
    elif "tsv" in files or "jsonl" in files:
        kind = "tsv" if "tsv" in files else "jsonl"
        yield from table_columns(files[kind], kind, src_lang, tgt_lang, positional, size)
    else:
        for path in files["parquet"]:
            for batch in pq.ParquetFile(path).iter_batches(batch_size=size):
                yield arrow_columns(batch, src_lang, tgt_lang)


def table_columns(
    paths: list[Path], kind: str, src_lang: str, tgt_lang: str, positional: bool, size: int
) -> Iterator[tuple[list[str], list[str]]]:
    """TSV or JSON Lines shards, row by row; the header of each TSV shard names its columns."""
    for path in paths:
        cols, width, number = [0, 1], 2, 0
        for lines in text_lines(path, size):
            rows = []
            for line in lines:
                number += 1
                if not line.strip():
                    pair = ("", "")
                elif kind == "jsonl":
                    row = json_row(path, number, line, (src_lang, tgt_lang))
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


def arrow_columns(batch: Any, src_lang: str, tgt_lang: str) -> tuple[list, list]:
    """Two columns of an Arrow table or batch as lists (None for nulls), never dicts per row."""
    if "translation" in batch.schema.names:
        pairs = batch.column("translation")
        src, tgt = (pc.struct_field(pairs, lang) for lang in (src_lang, tgt_lang))
        return src.to_pylist(), tgt.to_pylist()
    return batch.column(src_lang).to_pylist(), batch.column(tgt_lang).to_pylist()


def schema_langs(schema: pa.Schema) -> list[str]:
    if "translation" in schema.names and pa.types.is_struct(schema.field("translation").type):
        return sorted(f.name for f in schema.field("translation").type)
    return sorted(f.name for f in schema if f.type in (pa.string(), pa.large_string()))


def read_lines(path: str | Path) -> list[str]:
    """Lines of a UTF-8 file (plain or gzip), split on '\\n' only: U+2028 cannot break alignment."""
    return [line for chunk in text_lines(Path(path)) for line in chunk]


def text_lines(path: Path, size: int = CHUNK_PAIRS) -> Iterator[list[str]]:
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


def json_row(path: Path, number: int, line: str, need: tuple[str, ...] = ()) -> dict[str, Any]:
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
