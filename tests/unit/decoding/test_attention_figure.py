"""seq2seq.decoding.attention_figure called with values: a panel per checkpoint on the chosen pair,
side by side, and a pair outside the split refused (the command on a trained checkpoint:
tests/e2e/test_plot_attention.py)."""

from pathlib import Path

import pytest

from seq2seq.decoding.attention_figure import AttentionFigure, PairChoice, attention_figure
from seq2seq.decoding.translator import Translator
from seq2seq.errors import UserError
from tests.conftest import write_corpus


@pytest.fixture
def in_run_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The premove checkpoint names the corpus `corpus` (relative): write it in a fresh folder."""
    monkeypatch.chdir(tmp_path)
    return write_corpus(tmp_path / "corpus")


def test_each_checkpoint_is_a_panel_on_the_chosen_pair(
    premove_checkpoint: Path, in_run_folder: Path
) -> None:
    sources = (in_run_folder / "test.de").read_text("utf-8").splitlines()
    references = (in_run_folder / "test.en").read_text("utf-8").splitlines()
    choice = PairChoice(split="test", index=2)
    figure = attention_figure([premove_checkpoint, premove_checkpoint], choice)
    assert isinstance(figure, AttentionFigure) and len(figure.panels) == 2
    panel = figure.panels[0]
    assert panel.title == "rnn additive, teacher-forced: premove-gru-last.ckpt"
    [expected] = Translator.load(premove_checkpoint).align([sources[2]], [references[2]])
    assert panel.translation.tgt_tokens == expected.tgt_tokens  # the reference, read teacher-forced
    height, width, _ = panel.image.shape
    assert figure.image.shape == (height, 2 * width + 12, 3)  # two panels, a 12-pixel gap


def test_a_pair_outside_the_split_names_the_index(
    premove_checkpoint: Path, in_run_folder: Path
) -> None:
    with pytest.raises(UserError, match=r"^--index 20: split 'test' of .* has 20 pairs, numbered"):
        attention_figure([premove_checkpoint], PairChoice(split="test", index=20))


def test_a_checkpoint_with_a_foresight_head_shows_its_reading_beside_the_attention(
    premove_checkpoint: Path, in_run_folder: Path
) -> None:
    from seq2seq.commands import foresight as foresight_command

    argv = [str(premove_checkpoint), "--out", "fs.ckpt", "--steps", "2", "--batch-tokens", "200"]
    assert foresight_command.main(argv) == 0
    sources = (in_run_folder / "test.de").read_text("utf-8").splitlines()
    references = (in_run_folder / "test.en").read_text("utf-8").splitlines()
    figure = attention_figure([premove_checkpoint, "fs.ckpt"], PairChoice(split="test", index=2))
    titles = [panel.title for panel in figure.panels]
    assert titles == [
        "rnn additive, teacher-forced: premove-gru-last.ckpt",
        "rnn additive, teacher-forced: fs.ckpt",
        "rnn additive, teacher-forced, foresight: fs.ckpt",
    ]
    assert [panel.translation.reading for panel in figure.panels] == [
        "attention", "attention", "foresight"
    ]  # fmt: skip
    [read] = Translator.load("fs.ckpt").align([sources[2]], [references[2]], reading="foresight")
    drawn = figure.panels[2].translation.attention
    assert drawn.equal(read.attention) and not drawn.equal(figure.panels[1].translation.attention)
    beam = attention_figure(["fs.ckpt"], PairChoice(split="test", index=2), beam=2)
    assert [panel.translation.reading for panel in beam.panels] == ["attention", "foresight"]
    assert beam.panels[1].title == "rnn additive, beam 2, foresight: fs.ckpt"
    assert beam.panels[0].translation.tgt_tokens == beam.panels[1].translation.tgt_tokens


def test_a_panel_names_a_decoder_other_than_bahdanaus() -> None:
    from seq2seq.decoding.attention_figure import model_name

    assert model_name({"model": "rnn", "score": "dot"}) == "rnn dot"  # before the seam
    assert model_name({"model": "rnn", "score": "dot", "decoder": "bahdanau"}) == "rnn dot"
    assert model_name({"model": "rnn", "score": "dot", "decoder": "cgru"}) == "rnn cgru dot"
    assert model_name({"model": "transformer", "d_model": 8}) == "transformer"
