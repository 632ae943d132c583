"""Both directions joined: the word links of a source->target and a target->source translator, made
one set by `symmetrize` (intersection, union, grow-diag-final, grow-diag-final-and).

Each translator reads its own direction: the forward one a pair (source, target), the reverse one the
same pair turned round (target, source), teacher-forced; on a translation, the reverse one reads the
forward one's output as its source. The reverse links, (target word, source word), are flipped, and
the two sets joined as a statistical aligner's two directions are (Koehn et al. 2005); awesome-align
and fast_align report joined links beating either direction alone.

`JoinedTranslator` offers `translate` and `align` as `seq2seq.decoding.translator.Translator` does
(any two objects with those methods will do: this layer does not import the decoding one): the results
are the forward translator's, their `word_alignment` the joined links and their `reading`
"joined:<method>" (with ":foresight" after it when the two read foresight heads); the matrices
(`attention`, `word_attention`) stay the forward direction's. Where both name their corpus (a
Translator's `corpus`), the reverse one must translate the other way round (ValueError if not).
"""

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Protocol

from seq2seq.alignment.words import JOINS, Join, flip, symmetrize


def opposite_error(forward: Any, reverse: Any) -> str | None:
    """Why `reverse` cannot be read as `forward`'s other direction, or None: each is a corpus as
    `seq2seq.checkpoint.corpus_of` gives it ({"src": "de", "tgt": "en", ...}); one that names no
    corpus (None) is taken at its word."""
    if not forward or not reverse:
        return None
    if (reverse["src"], reverse["tgt"]) == (forward["tgt"], forward["src"]):
        return None
    return f"translates {reverse['src']}->{reverse['tgt']}, not {forward['tgt']}->{forward['src']}"


class Aligner(Protocol):
    """What a joined translator needs of each direction (seq2seq.decoding.translator.Translator)."""

    def translate(self, sentences: list[str], *args: Any, **kwargs: Any) -> list[Any]: ...

    def align(
        self, sources: list[str], targets: list[str], *args: Any, **kwargs: Any
    ) -> list[Any]: ...


def joined_label(method: Join, reading: str = "attention") -> str:
    """The reading's name: "joined:<method>", with ":<reading>" after it unless it is attention."""
    return f"joined:{method}" + ("" if reading == "attention" else f":{reading}")


def join(forward: Any, reverse: Any, method: Join, reading: str = "attention") -> Any:
    """`forward` (a Translation with word links) with its links joined to those of `reverse`, the
    other direction's reading of the same pair, turned round."""
    links = symmetrize(forward.word_alignment or [], flip(reverse.word_alignment or []), method)
    return replace(forward, word_alignment=links, reading=joined_label(method, reading))


class JoinedTranslator:
    """Translate and align with `forward`, its word links joined with `reverse`'s by `method`."""

    def __init__(self, forward: Aligner, reverse: Aligner, method: Join = "grow-diag-final-and"):
        if method not in JOINS:
            raise ValueError(f"method must be one of {', '.join(JOINS)}, got {method!r}")
        error = opposite_error(getattr(forward, "corpus", None), getattr(reverse, "corpus", None))
        if error:  # two translators of one direction would "join" links of unrelated word pairs
            raise ValueError(f"the reverse translator {error}")
        self.forward, self.reverse, self.method = forward, reverse, method

    def translate(
        self,
        sentences: list[str],
        search: Any = None,
        batch_tokens: int = 4096,
        batch_size: int | None = None,
        return_alignments: bool = False,
        direction: str = "tgt2src",
        check: Callable[[], None] | None = None,
        reading: str = "attention",
        **settings: float,
    ) -> list[Any]:
        """`Translator.translate`'s results; with `return_alignments`, each hypothesis (n-best ones
        included) is read by the reverse translator too and the links joined."""
        results = self.forward.translate(
            sentences, search, batch_tokens, batch_size, return_alignments, direction, check,
            reading=reading, **settings,
        )  # fmt: skip
        if not return_alignments:
            return results
        hyps = [hyp for result in results for hyp in result.nbest or [result]]
        sources = [src for src, result in zip(sentences, results, strict=True)
                   for _ in result.nbest or [result]]  # fmt: skip
        back = self.reverse.align(
            [hyp.text for hyp in hyps], sources, batch_tokens, batch_size, direction, check, reading
        )
        joined = iter(join(h, b, self.method, reading) for h, b in zip(hyps, back, strict=True))
        out = []
        for result in results:
            if not result.nbest:
                out.append(next(joined))
                continue
            nbest = [next(joined) for _ in result.nbest]
            out.append(replace(nbest[0], nbest=nbest))
        return out

    def align(
        self,
        sources: list[str],
        targets: list[str],
        batch_tokens: int = 4096,
        batch_size: int | None = None,
        direction: str = "tgt2src",
        check: Callable[[], None] | None = None,
        reading: str = "attention",
    ) -> list[Any]:
        """`Translator.align`'s results, their links joined with the reverse reading of each pair."""
        fwd = self.forward.align(
            sources, targets, batch_tokens, batch_size, direction, check, reading
        )
        back = self.reverse.align(
            targets, sources, batch_tokens, batch_size, direction, check, reading
        )
        return join_all(fwd, back, self.method, reading)


def join_all(
    forward: Sequence[Any], reverse: Sequence[Any], method: Join, reading: str = "attention"
) -> list[Any]:
    """`join` pair by pair: the forward readings of some pairs and the reverse readings of the same."""
    return [join(f, r, method, reading) for f, r in zip(forward, reverse, strict=True)]
