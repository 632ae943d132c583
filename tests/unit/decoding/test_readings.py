"""The Translator's readings: alignments from a foresight head (teacher-forced on a pair or on the
chosen translation), named in every result; an old checkpoint reads as before; a copy with a head
translates as the original; two translators' links joined (seq2seq.alignment.joined)."""

from pathlib import Path

import pytest
import torch

from seq2seq.alignment.foresight import CHECKPOINT_KEY, FitSettings, head_record
from seq2seq.alignment.joined import JoinedTranslator
from seq2seq.alignment.words import flip, symmetrize
from seq2seq.data.batching import collate
from seq2seq.decoding.search import SearchConfig
from seq2seq.decoding.translator import Translator, word_alignment
from seq2seq.errors import UserError
from seq2seq.models.foresight import foresight_weights, head_for, translator_states

SOURCES = ["Der kleine hund läuft im park", "Zwei alte frauen sitzen", "Ein ball"]
TARGETS = ["The small dog runs in the park", "Two old women sit", "A ball"]


@pytest.fixture(scope="module")
def with_head(premove_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the premove checkpoint with an untrained foresight head inside."""
    checkpoint = torch.load(premove_checkpoint, weights_only=True)
    translator = Translator.load(premove_checkpoint)
    torch.manual_seed(0)
    head = head_for(translator.model)
    fit = type("Fit", (), {"head": head, "losses": (1.0,)})  # what head_record reads of a fit
    checkpoint[CHECKPOINT_KEY] = head_record(fit, FitSettings(steps=1), "none")
    path = tmp_path_factory.mktemp("foresight") / "with-head.ckpt"
    torch.save(checkpoint, path)
    return path


def head_reading(translator: Translator, src: list[int], tgt: list[int]) -> torch.Tensor:
    """The head's weights (T + 1, S + 1) for one pair of ids, computed here from the model."""
    batch = collate([{"src_ids": src, "tgt_ids": tgt, "index": 0}])
    with torch.no_grad():
        weights, _ = foresight_weights(
            translator.foresight, translator_states(translator.model, batch)
        )
    return weights[0]


def test_an_old_checkpoint_has_no_head_and_reads_attention_as_before(
    premove_checkpoint: Path,
) -> None:
    translator = Translator.load(premove_checkpoint)
    assert translator.foresight is None
    for source, target, result in zip(SOURCES, TARGETS, translator.align(SOURCES, TARGETS),
                                      strict=True):  # fmt: skip
        assert result.reading == "attention" and result.to_dict()["reading"] == "attention"
        batch = collate([{"src_ids": translator.tokenizer.encode(source),
                          "tgt_ids": translator.tokenizer.encode(target), "index": 0}])  # fmt: skip
        with torch.no_grad():
            inputs = [batch[key] for key in ("src", "src_lens", "src_mask", "tgt_in")]
            _, weights = translator.model(*inputs)
        torch.testing.assert_close(result.attention, weights[0])  # the model's own attention
    with pytest.raises(UserError, match="holds no foresight head"):
        translator.align(SOURCES, TARGETS, reading="foresight")
    with pytest.raises(ValueError, match="reading must be one of attention, foresight"):
        translator.translate(SOURCES, reading="guess")


def test_a_copy_with_a_head_translates_and_attends_as_the_original(
    premove_checkpoint: Path, with_head: Path
) -> None:
    original, copy = Translator.load(premove_checkpoint), Translator.load(with_head)
    assert copy.foresight is not None
    settings = {"beam": 3, "nbest": 2, "return_alignments": True}
    for mine, theirs in zip(copy.translate(SOURCES, **settings),
                            original.translate(SOURCES, **settings), strict=True):  # fmt: skip
        assert (mine.text, mine.score, mine.word_alignment) == (
            theirs.text, theirs.score, theirs.word_alignment
        )  # fmt: skip
        assert torch.equal(mine.attention, theirs.attention)
    for mine, theirs in zip(copy.align(SOURCES, TARGETS), original.align(SOURCES, TARGETS),
                            strict=True):  # fmt: skip
        assert torch.equal(mine.attention, theirs.attention) and mine.score == theirs.score


def test_the_foresight_reading_of_a_pair_is_the_heads(with_head: Path) -> None:
    translator = Translator.load(with_head)
    plain = translator.align(SOURCES, TARGETS)
    read = translator.align(SOURCES, TARGETS, reading="foresight")
    for source, target, mine, theirs in zip(SOURCES, TARGETS, read, plain, strict=True):
        src, tgt = translator.tokenizer.encode(source), translator.tokenizer.encode(target)
        torch.testing.assert_close(mine.attention, head_reading(translator, src, tgt))
        assert not torch.allclose(mine.attention, theirs.attention)
        assert mine.score == pytest.approx(theirs.score)  # the model's probability, as before
        assert mine.reading == "foresight" and mine.to_dict()["reading"] == "foresight"
        src_spans = translator.tokenizer.encode_with_spans(source)[1]
        tgt_spans = translator.tokenizer.encode_with_spans(target)[1]
        words, links = word_alignment(mine.attention, source, src_spans, target, tgt_spans)
        assert mine.word_alignment == links and torch.equal(mine.word_attention, words)


def test_the_foresight_reading_of_a_translation_reads_the_chosen_hypotheses(
    with_head: Path,
) -> None:
    translator = Translator.load(with_head)
    search = SearchConfig(beam=3, nbest=2)
    read = translator.translate(SOURCES, search, return_alignments=True, reading="foresight")
    plain = translator.translate(SOURCES, search, return_alignments=True)
    src_ids = [translator.tokenizer.encode(s) for s in SOURCES]
    found = translator.search(src_ids, search)  # the hypotheses' ids, as the search gave them
    for src, hyps, mine, theirs in zip(src_ids, found, read, plain, strict=True):
        assert [h.text for h in mine.nbest] == [h.text for h in theirs.nbest]  # search unchanged
        for ids, hyp in zip(hyps.tokens, mine.nbest, strict=True):
            assert hyp.reading == "foresight"
            torch.testing.assert_close(hyp.attention, head_reading(translator, src, list(ids)))
    with pytest.raises(ValueError, match="reads alignments: pass return_alignments=True"):
        translator.translate(SOURCES[:1], reading="foresight")  # nothing it would read


def test_two_real_translators_joined_give_the_symmetrised_links(premove_checkpoint: Path) -> None:
    forward, reverse = Translator.load(premove_checkpoint), Translator.load(premove_checkpoint)
    assert forward.corpus is not None and (forward.corpus["src"], forward.corpus["tgt"]) == (
        "de",
        "en",
    )
    with pytest.raises(ValueError, match="the reverse translator translates de->en, not en->de"):
        JoinedTranslator(
            forward, reverse, "grow-diag-final"
        )  # a checkpoint cannot be its own reverse
    # The one tiny model stands in for both directions: the reverse one's corpus turned round, as an
    # en->de checkpoint's would be.
    reverse.corpus = {**forward.corpus, "src": "en", "tgt": "de"}
    joined = JoinedTranslator(forward, reverse, "grow-diag-final")
    fwd, back = forward.align(SOURCES, TARGETS), reverse.align(TARGETS, SOURCES)
    for mine, f, b in zip(joined.align(SOURCES, TARGETS), fwd, back, strict=True):
        assert mine.word_alignment == symmetrize(
            f.word_alignment, flip(b.word_alignment), "grow-diag-final"
        )
        assert mine.reading == "joined:grow-diag-final"
        assert mine.to_dict()["reading"] == "joined:grow-diag-final"
        assert torch.equal(mine.attention, f.attention)  # the matrices stay the forward's
    settings = {"beam": 2, "nbest": 2, "return_alignments": True}
    results = joined.translate(["", *SOURCES], **settings)
    assert results[0].text == "" and results[0].word_alignment == []  # a blank line joins to none
    plain = forward.translate(SOURCES, **settings)
    for source, result, own in zip(SOURCES, results[1:], plain, strict=True):
        assert [h.text for h in result.nbest] == [h.text for h in own.nbest]
        for hyp, f in zip(result.nbest, own.nbest, strict=True):  # each read back, then joined
            [b] = reverse.align([hyp.text], [source])
            expected = symmetrize(f.word_alignment, flip(b.word_alignment), "grow-diag-final")
            assert hyp.word_alignment == expected and hyp.reading == "joined:grow-diag-final"
