"""Alignment figures: axes carry the tokens, one panel per head plus the mean, readable sizes."""

from pathlib import Path

import numpy as np
import pytest
import torch

from seq2seq.alignment.plotting import AlignmentPlot, alignment_figure, figure_to_array, save_figure

SRC = ["▁Ein", "▁Hund", "▁läuft", ".", "</s>"]
TGT = ["▁A", "▁dog", "▁runs", "</s>"]


def heatmaps(fig) -> list:
    """The axes that show a matrix (the colour bar's axes hold no image)."""
    return [ax for ax in fig.axes if ax.images]


def test_single_head_has_token_ticks_and_a_0_to_1_colour_bar() -> None:
    weights = torch.rand(len(TGT), len(SRC)).softmax(-1)  # (T, S)
    fig = alignment_figure(weights, SRC, TGT, title="step 10")
    (ax,) = heatmaps(fig)
    assert [t.get_text() for t in ax.get_xticklabels()] == SRC  # source on x
    assert [t.get_text() for t in ax.get_yticklabels()] == TGT  # target on y
    np.testing.assert_allclose(ax.images[0].get_array(), weights.numpy())
    assert ax.images[0].get_clim() == (0.0, 1.0)
    (bar,) = [a for a in fig.axes if getattr(a, "_colorbar", None) is not None]
    assert bar.get_ylim() == (0.0, 1.0)


def test_multi_head_gets_one_panel_per_head_plus_the_mean() -> None:
    weights = torch.rand(len(TGT), 4, len(SRC)).softmax(-1)  # (T, N, S)
    panels = heatmaps(alignment_figure(weights, SRC, TGT))
    assert [ax.get_title() for ax in panels] == ["head 0", "head 1", "head 2", "head 3", "mean"]
    # Tokens on the outer panels only: targets on the left column, sources under each column's last.
    assert [bool(ax.get_yticklabels()[0].get_text()) for ax in panels] == [
        True,
        False,
        False,
        True,
        False,
    ]
    assert [bool(ax.get_xticklabels()[0].get_text()) for ax in panels] == [
        False,
        False,
        True,
        True,
        True,
    ]
    np.testing.assert_allclose(panels[2].images[0].get_array(), weights[:, 2].numpy())
    np.testing.assert_allclose(panels[-1].images[0].get_array(), weights.mean(1).numpy(), rtol=1e-6)


def test_even_a_one_token_pair_renders_at_least_200_px_wide(tmp_path: Path) -> None:
    fig = alignment_figure(np.ones((1, 1)), ["</s>"], ["</s>"])
    image = figure_to_array(fig)  # (H, W, 3)
    assert image.dtype == np.uint8 and image.shape[2] == 3 and image.shape[1] >= 200
    path = save_figure(fig, tmp_path / "plots" / "a.png")
    assert path.read_bytes().startswith(b"\x89PNG")


def test_token_counts_must_match_the_matrix() -> None:
    with pytest.raises(ValueError, match="4x5"):
        alignment_figure(torch.rand(len(TGT), len(SRC)), SRC, TGT[:-1])


@pytest.mark.parametrize("shape", [(len(TGT), len(SRC)), (len(TGT), 2, len(SRC))])
def test_a_redrawn_plot_equals_a_fresh_figure(shape: tuple[int, ...]) -> None:
    first, second = torch.rand(shape).softmax(-1), torch.rand(shape).softmax(-1)
    plot = AlignmentPlot(first, SRC, TGT, title="teacher-forced")
    plot.render()  # draws the background once
    plot.update(second)  # then only the heatmaps are redrawn
    fresh = figure_to_array(alignment_figure(second, SRC, TGT, title="teacher-forced"))
    np.testing.assert_array_equal(plot.render(), fresh)
    with pytest.raises(ValueError, match="do not fit"):
        plot.update(torch.rand(2, len(SRC)))


def test_the_last_panel_is_the_head_alignments_read() -> None:
    weights = torch.rand(len(TGT), 3, len(SRC)).softmax(-1)  # (T, N, S)
    panels = heatmaps(alignment_figure(weights, SRC, TGT, title="guided", head=1))
    assert [ax.get_title() for ax in panels] == ["head 0", "head 1", "head 2", "aligned: head 1"]
    np.testing.assert_allclose(panels[-1].images[0].get_array(), weights[:, 1].numpy())
