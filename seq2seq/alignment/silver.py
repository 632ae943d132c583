"""Silver word alignments: eflomal's links for a corpus split (`seq2seq silver-alignments` is its
command line, which writes them).

Multi30k has no hand-made word alignments, so the reference our attention is scored against is the
output of eflomal (Östling & Tiedemann 2016), a statistical aligner. Its estimates improve with more
text, so a test set is aligned together with extra pairs (the training set) and only the test set's
lines are kept; guided alignment's training links come from the training set aligned alone, so no
test text shapes them. eflomal aligns both directions; `symmetrize` makes one set of them
(seq2seq.alignment.words.symmetrize: `intersect` or `grow-diag-final-and`; eflomal ships no
symmetrisation of its own). `with_possible` also keeps the links of either direction left out, as
possible links (`ipj`).

Words are the whitespace-separated tokens of the raw sentences, numbered from 0: the same words the
model's alignments use. eflomal lowercases tokens for its statistics, which leaves indices alone. It
seeds itself from /dev/urandom, so two runs differ slightly. Needs `pip install -e .[align]`.
"""

import importlib.util
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from seq2seq.alignment.words import format_pharaoh, symmetrize
from seq2seq.data.corpus import read_lines
from seq2seq.data.words import Link, check_links_fit
from seq2seq.errors import UserError

Symmetrize = Literal["intersect", "grow-diag-final-and"]


@dataclass(frozen=True)
class SilverLinks:
    """The links of each pair of a split, as Pharaoh lines ("" for a blank pair), and what made them."""

    lines: tuple[str, ...]  # one a pair of the split, in its order
    extra_pairs: int  # pairs aligned beside the split's, not kept
    seconds: float  # eflomal's time

    @property
    def links_per_sentence(self) -> float:
        return sum(len(line.split()) for line in self.lines) / max(len(self.lines), 1)

    def text(self) -> str:
        """The Pharaoh file: one line a pair, each ended by a newline."""
        return "".join(line + "\n" for line in self.lines)


def silver_alignments(
    src_path: str | Path,
    tgt_path: str | Path,
    extra: tuple[str | Path, str | Path] | None = None,
    symmetrize_as: Symmetrize = "intersect",
    with_possible: bool = False,
) -> SilverLinks:
    """eflomal's links for the pairs of two line-aligned files (plain or .gz), aligned together
    with the `extra` pair of files when given (their links are dropped); blank pairs (either side)
    are not aligned and keep an empty line. Bad files, a missing eflomal or links outside a
    sentence are a UserError naming the file."""
    extra_src, extra_tgt = read_pair(*extra) if extra else ([], [])
    src, tgt = read_pair(src_path, tgt_path)
    start = time.perf_counter()
    real = [i for i, (s, t) in enumerate(zip(src, tgt, strict=True)) if s.split() and t.split()]
    fwd, rev = align_both_ways(
        extra_src + [src[i] for i in real], extra_tgt + [tgt[i] for i in real]
    )
    seconds = time.perf_counter() - start
    lines = [""] * len(src)
    for i, k in zip(real, range(len(extra_src), len(fwd)), strict=True):
        check_links_fit([fwd[k] | rev[k]], [src[i]], [tgt[i]], str(src_path), first=i + 1)
        chosen = symmetrize(fwd[k], rev[k], symmetrize_as)
        line = format_pharaoh(chosen)
        if with_possible:
            maybe = sorted((fwd[k] | rev[k]) - set(chosen))
            line = " ".join([line] * bool(line) + [f"{s}p{t}" for s, t in maybe])
        lines[i] = line
    return SilverLinks(tuple(lines), len(extra_src), seconds)


def require_eflomal() -> None:
    """Refuses before any work when eflomal, which makes silver links, is not installed."""
    if importlib.util.find_spec("eflomal") is None:
        raise UserError("eflomal is not installed: pip install -e .[align]")


def align_both_ways(src: list[str], tgt: list[str]) -> tuple[list[set[Link]], list[set[Link]]]:
    """eflomal's forward and reverse links per pair, both written (source word, target word)."""
    require_eflomal()
    import eflomal

    with tempfile.TemporaryDirectory(prefix="eflomal-") as tmp:
        fwd, rev = Path(tmp) / "fwd", Path(tmp) / "rev"
        try:  # eflomal reads tokens with str.split(): the raw sentence's whitespace words
            eflomal.Aligner().align(
                src, tgt, links_filename_fwd=str(fwd), links_filename_rev=str(rev), quiet=True
            )
        except SystemExit:  # eflomal exits when its binary is missing
            raise UserError("eflomal could not run its binary: pip install -e .[align]") from None
        return read_links(fwd, len(src)), read_links(rev, len(src))


def read_pair(src_path: str | Path, tgt_path: str | Path) -> tuple[list[str], list[str]]:
    """Line-aligned sentences of two files; a count mismatch names both files."""
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    if len(src) != len(tgt):
        raise UserError(f"{src_path} has {len(src)} lines but {tgt_path} has {len(tgt)}")
    return src, tgt


def read_links(path: Path, n: int) -> list[set[Link]]:
    """eflomal's links file, both directions written source-target; n lines expected."""
    if not path.exists():
        raise UserError(f"eflomal wrote no {path.name} links (see its messages above)")
    lines = read_lines(path)
    if len(lines) != n:
        raise UserError(f"eflomal wrote {len(lines)} {path.name} lines for {n} sentence pairs")
    return [{tuple(map(int, pair.split("-"))) for pair in line.split()} for line in lines]
