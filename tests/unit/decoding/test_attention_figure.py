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
