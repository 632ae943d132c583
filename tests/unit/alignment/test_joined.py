"""Both directions joined (seq2seq.alignment.joined): the links of a forward and a reverse reading,
the reverse turned round, made one by each symmetrisation and named by it. Two stand-in translators
whose links are written by hand; with real ones: tests/unit/decoding/test_readings.py."""

import pytest
import torch

from seq2seq.alignment.joined import JoinedTranslator, joined_label
from seq2seq.decoding.translator import Translation

# The hand-made case of test_alignment's test_symmetrize_by_hand, (source, target) links.
FWD = [(0, 0), (1, 1), (2, 1), (4, 4)]
REV = [(0, 0), (1, 1), (0, 1), (3, 4)]
EXPECTED = {
    "intersect": [(0, 0), (1, 1)],
    "union": [(0, 0), (0, 1), (1, 1), (2, 1), (3, 4), (4, 4)],
    "grow-diag-final": [(0, 0), (1, 1), (2, 1), (3, 4), (4, 4)],
    "grow-diag-final-and": [(0, 0), (1, 1), (2, 1), (4, 4)],
}
SOURCE, TARGET = "a b c d e", "v w x y z"


def result(text: str, links: list, nbest: list | None = None) -> Translation:
    return Translation(text, -1.0, [], [], torch.zeros(1, 1), nbest=nbest or [],
                       word_alignment=links)  # fmt: skip


class Stub:
    """A translator whose every reading has `links`; it records what it was asked to read."""

    def __init__(self, links: list, corpus: dict | None = None) -> None:
        self.links, self.asked, self.corpus = links, [], corpus

    def align(self, sources, targets, *args, **kwargs) -> list[Translation]:
        self.asked.append(("align", list(sources), list(targets), kwargs.get("reading", args[-1])))
        return [result(t, self.links) for t in targets]

    def translate(self, sentences, *args, **kwargs) -> list[Translation]:
        self.asked.append(("translate", list(sentences), kwargs["reading"]))
        return [result(TARGET, self.links, [result(TARGET, self.links)] * 2) for _ in sentences]


@pytest.mark.parametrize("method", list(EXPECTED))
def test_joined_links_are_the_symmetrisation_of_the_two_readings(method: str) -> None:
    reverse = Stub([(t, s) for s, t in REV])  # the reverse reading writes (target, source)
    joined = JoinedTranslator(Stub(FWD), reverse, method)
    [aligned] = joined.align([SOURCE], [TARGET])
    assert aligned.word_alignment == EXPECTED[method]
    assert aligned.reading == f"joined:{method}" and aligned.text == TARGET
    assert reverse.asked == [("align", [TARGET], [SOURCE], "attention")]  # the pair turned round


def test_every_hypothesis_of_a_translation_is_read_back_and_joined() -> None:
    reverse = Stub([(t, s) for s, t in REV])
    joined = JoinedTranslator(Stub(FWD), reverse, "intersect")
    [best] = joined.translate([SOURCE], return_alignments=True, reading="foresight")
    assert [h.word_alignment for h in [best, *best.nbest]] == [EXPECTED["intersect"]] * 3
    assert {h.reading for h in [best, *best.nbest]} == {"joined:intersect:foresight"}
    assert reverse.asked == [("align", [TARGET] * 2, [SOURCE] * 2, "foresight")]
    [plain] = joined.translate([SOURCE], reading="attention")  # no alignments asked: no join
    assert plain.word_alignment == FWD and plain.reading == "attention"


def test_an_unknown_method_is_refused() -> None:
    with pytest.raises(ValueError, match="grow-diag-final-and, got 'grow'"):
        JoinedTranslator(Stub(FWD), Stub(REV), "grow")
    assert joined_label("union") == "joined:union"


def test_two_translators_of_one_direction_are_refused_and_a_corpus_unnamed_is_taken_at_its_word():
    de_en, en_de = {"src": "de", "tgt": "en"}, {"src": "en", "tgt": "de"}
    for forward, reverse, said in (
        (de_en, de_en, "translates de->en, not en->de"),
        (en_de, en_de, "translates en->de, not de->en"),
        (de_en, {"src": "fr", "tgt": "en"}, "translates fr->en, not en->de"),
        (de_en, {"src": "en", "tgt": "fr"}, "translates en->fr, not en->de"),
    ):
        with pytest.raises(ValueError, match=f"the reverse translator {said}"):
            JoinedTranslator(Stub(FWD, forward), Stub(REV, reverse))
    for forward, reverse in ((de_en, en_de), (en_de, de_en), (None, de_en), (de_en, None)):
        JoinedTranslator(Stub(FWD, forward), Stub(REV, reverse))  # opposite, or one unknown
    JoinedTranslator(object(), object())  # objects with no corpus at all: nothing to check
