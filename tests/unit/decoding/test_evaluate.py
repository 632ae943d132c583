"""seq2seq.decoding.evaluate called with values: the typed figures, nothing written, alignment
scores when asked for, bad input refused before translating (the command: tests/unit/commands, and
on a trained checkpoint tests/e2e/test_evaluate.py)."""

from pathlib import Path

import pytest

from seq2seq.alignment.words import format_pharaoh
from seq2seq.decoding.evaluate import AlignmentScoring, EvalOptions, Evaluation, evaluate
from seq2seq.decoding.metrics import corpus_bleu, corpus_chrf
from seq2seq.decoding.search_config import SearchConfig
from seq2seq.decoding.translator import Translator
from seq2seq.errors import UserError
from tests.conftest import write_corpus


@pytest.fixture
def corpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The premove checkpoint names the corpus `corpus` (relative): write it in a fresh folder."""
    monkeypatch.chdir(tmp_path)
    return write_corpus(tmp_path / "corpus")


def files(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*"))


def test_the_figures_of_a_split_are_returned_and_nothing_is_written(
    premove_checkpoint: Path, corpus: Path
) -> None:
    before = files(corpus.parent), files(premove_checkpoint.parent)
    found = evaluate(premove_checkpoint, "test", options=EvalOptions(search=SearchConfig(beam=2)))
    assert (
        isinstance(found, Evaluation)
        and (files(corpus.parent), files(premove_checkpoint.parent)) == before
    )
    sources = (corpus / "test.de").read_text("utf-8").splitlines()
    references = (corpus / "test.en").read_text("utf-8").splitlines()
    expected = [t.text for t in Translator.load(premove_checkpoint).translate(sources, beam=2)]
    assert found.hypotheses == tuple(expected) and found.sentences == 20
    assert found.bleu == corpus_bleu(expected, references)
    assert found.chrf == corpus_chrf(expected, references)
    assert found.bleu.signature.startswith("nrefs:1|case:mixed") and found.bleu.hyp_len > 0
    assert found.search.beam == 2 and found.device == "cpu" and found.alignment is None
    assert found.sentences_per_second == pytest.approx(20 / found.seconds)
    assert found.data.endswith("test (de-en)") and found.checkpoint == str(premove_checkpoint)


def test_alignments_are_scored_against_a_gold_file(premove_checkpoint: Path, corpus: Path) -> None:
    sources = (corpus / "test.de").read_text("utf-8").splitlines()
    references = (corpus / "test.en").read_text("utf-8").splitlines()
    own = Translator.load(premove_checkpoint).align(sources, references)
    gold = corpus / "gold.align"
    gold.write_text("".join(format_pharaoh(r.word_alignment) + "\n" for r in own), "utf-8")
    options = EvalOptions(search=SearchConfig(beam=1), alignment=AlignmentScoring(str(gold)))
    found = evaluate(premove_checkpoint, "test", options=options)
    assert found.alignment is not None and found.alignment.gold == str(gold)
    score = found.alignment.score  # the model's own teacher-forced links: no error
    assert (score.aer, score.precision, score.recall) == (0.0, 1.0, 1.0)
    assert score.hyp_links == sum(len(r.word_alignment) for r in own)
    assert found.alignment.on == "the first reference, teacher-forced, tgt2src"


def test_bad_input_is_refused_before_the_checkpoint_is_read(tmp_path: Path) -> None:
    never = tmp_path / "never-read.ckpt"
    with pytest.raises(UserError, match="^--src-file and --ref-file go together$"):
        evaluate(never, src_file="src.txt")
    (tmp_path / "src.txt").write_text("a\nb\n")
    (tmp_path / "ref.txt").write_text("a\n")
    with pytest.raises(UserError, match=r"src\.txt has 2 lines but .*ref\.txt has 1"):
        evaluate(never, src_file=str(tmp_path / "src.txt"), ref_files=[str(tmp_path / "ref.txt")])


def reversed_copy(checkpoint: Path, folder: Path) -> Path:
    """The checkpoint as if it translated en->de (same weights: the vocabulary is joint)."""
    import torch

    saved = torch.load(checkpoint, weights_only=True)
    corpus = saved["hyper_parameters"]["corpus"]
    corpus["src"], corpus["tgt"] = corpus["tgt"], corpus["src"]
    torch.save(saved, folder / "en-de.ckpt")
    return folder / "en-de.ckpt"


def test_a_reverse_checkpoint_scores_its_links_and_both_joined(
    premove_checkpoint: Path, corpus: Path
) -> None:
    from seq2seq.alignment.joined import join_all
    from seq2seq.alignment.words import JOINS, flip

    reverse = reversed_copy(premove_checkpoint, corpus.parent)
    sources = (corpus / "test.de").read_text("utf-8").splitlines()
    references = (corpus / "test.en").read_text("utf-8").splitlines()
    fwd = Translator.load(premove_checkpoint).align(sources, references)
    back = Translator.load(reverse).align(references, sources)
    gold = corpus / "gold.align"  # the forward links: their AER is 0, the others' is not
    gold.write_text("".join(format_pharaoh(r.word_alignment) + "\n" for r in fwd), "utf-8")
    scoring = AlignmentScoring(str(gold), reverse=str(reverse))
    found = evaluate(
        premove_checkpoint, "test", options=EvalOptions(SearchConfig(beam=1), alignment=scoring)
    )
    names = [r.reading for r in found.readings]
    assert names == ["attention", "reverse:attention", *(f"joined:{m}" for m in JOINS)]
    assert found.alignment is found.readings[0] and found.alignment.score.aer == 0.0
    links = [flip(r.word_alignment) for r in back]
    for method, scored in zip(JOINS, found.readings[2:], strict=True):
        joined = [r.word_alignment for r in join_all(fwd, back, method)]
        assert scored.score.hyp_links == sum(map(len, joined))
    assert found.readings[1].score.hyp_links == sum(map(len, links))
    union = found.readings[2 + JOINS.index("union")].score
    assert union.recall == 1.0 and union.hyp_links >= found.alignment.score.hyp_links


def test_a_reverse_of_the_same_direction_and_a_missing_head_are_refused_before_translating(
    premove_checkpoint: Path, corpus: Path
) -> None:
    gold = corpus / "gold.align"
    gold.write_text("0-0\n" * 20, "utf-8")
    same = AlignmentScoring(str(gold), reverse=str(premove_checkpoint))
    with pytest.raises(UserError, match=r"--reverse .* translates de->en, not en->de"):
        evaluate(premove_checkpoint, "test", options=EvalOptions(alignment=same))
    foresight = AlignmentScoring(str(gold), reading="foresight")
    with pytest.raises(UserError, match="--align-reading foresight: .* holds no foresight head"):
        evaluate(premove_checkpoint, "test", options=EvalOptions(alignment=foresight))


def test_the_foresight_reading_of_the_models_own_translations_is_scored(
    premove_checkpoint: Path, corpus: Path
) -> None:
    import torch

    from seq2seq.alignment.foresight import CHECKPOINT_KEY, FitSettings, head_record
    from seq2seq.models.foresight import head_for

    saved = torch.load(premove_checkpoint, weights_only=True)
    torch.manual_seed(0)
    fit = type(
        "Fit", (), {"head": head_for(Translator.load(premove_checkpoint).model), "losses": (1.0,)}
    )
    saved[CHECKPOINT_KEY] = head_record(fit, FitSettings(steps=1), "none")
    with_head = corpus.parent / "with-head.ckpt"
    torch.save(saved, with_head)
    sources = (corpus / "test.de").read_text("utf-8").splitlines()
    own = Translator.load(with_head).translate(
        sources, beam=1, return_alignments=True, reading="foresight"
    )
    gold = corpus / "gold.align"
    gold.write_text("".join(format_pharaoh(r.word_alignment) + "\n" for r in own), "utf-8")
    scoring = AlignmentScoring(str(gold), on="hyp", reading="foresight")
    found = evaluate(
        with_head, "test", options=EvalOptions(SearchConfig(beam=1), alignment=scoring)
    )
    assert found.alignment.reading == "foresight" and found.alignment.score.aer == 0.0
    plain = evaluate(
        with_head,
        "test",
        options=EvalOptions(SearchConfig(beam=1), alignment=AlignmentScoring(str(gold), on="hyp")),
    )
    assert plain.alignment.reading == "attention" and plain.alignment.score.aer > 0.0
