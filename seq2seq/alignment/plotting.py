"""Attention heatmaps: source subwords on x, target subwords on y, one panel per head plus their mean
(or, for a model whose alignments read one head, that head again as the last panel).

Figures are built on matplotlib's object API with an Agg canvas, never through `pyplot`: no global
figure registry to leak into, no GUI backend, and the caller's backend choice stays untouched.

Dimension letters: T target length, S source length, N heads, P panels (1, or N + 1).
"""

import math
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from torch import Tensor

CELL = 0.28  # inches per token: tick labels of short subwords stay readable
CHAR = 0.075  # inches per character of an 8 pt tick label, to size the margins
GAP = 0.2  # inches between panels, and before the colour bar
BAR = 0.7  # inches for the colour bar and its labels
DPI = 100


def panels(weights: Tensor | np.ndarray, head: int | None = None) -> np.ndarray:
    """(T, S) -> (1, T, S); (T, N, S) -> (N + 1, T, S): each head, then their mean, or with `head`
    that head (the one a model's alignments read, `Seq2Seq.alignment_head`)."""
    maps = np.asarray(weights.detach().float().cpu() if isinstance(weights, Tensor) else weights)
    if maps.ndim == 2:
        return maps[None]  # (1, T, S)
    last = maps.mean(1) if head is None else maps[:, head]  # (T, S)
    return np.concatenate([maps.transpose(1, 0, 2), last[None]])  # (N + 1, T, S)


class AlignmentPlot:
    """A heatmap figure of fixed tokens whose matrices can be swapped and re-rendered cheaply.

    Axes, tick labels and colour bar are drawn once; later `render` calls after `update` redraw only
    the heatmaps over that saved background (Agg blitting); margins and panels are placed by hand, in
    inches. Both for speed (docs/results/benchmarks.md#figures-once-kept-in-the-data-and-training-code).

    Args:
        weights: (T, S) single-head attention, or (T, N, S): then one panel per head plus their mean,
            three to a row, with the tokens on the outer panels only.
        src_tokens: S source subwords (x axis).
        tgt_tokens: T target subwords (y axis): row t is the attention used to predict tgt_tokens[t].
        title: put above the panels.
        head: the head the model's alignments read (None: the mean); the last panel shows it.
    """

    def __init__(
        self,
        weights: Tensor | np.ndarray,
        src_tokens: list[str],
        tgt_tokens: list[str],
        title: str | None = None,
        head: int | None = None,
    ) -> None:
        self.head = head
        maps = panels(weights, head)  # (P, T, S)
        P, T, S = maps.shape
        if (T, S) != (len(tgt_tokens), len(src_tokens)):
            raise ValueError(
                f"weights are {T}x{S} but there are {len(tgt_tokens)}x{len(src_tokens)} tokens"
            )
        cols, rows = min(P, 3), math.ceil(P / 3)
        left = CHAR * max(map(len, tgt_tokens)) + 0.25
        bottom = CHAR * max(map(len, src_tokens)) + 0.25  # x labels are rotated
        head, top = (0.35 if title else 0.1), (0.3 if P > 1 else 0.05)
        width, height = max(CELL * S, 1.5), max(CELL * T, 1.0)
        row_h = bottom + height + top
        fig_w, fig_h = left + cols * (width + GAP) + BAR, head + rows * row_h
        self.figure = Figure(figsize=(fig_w, fig_h), dpi=DPI)
        self._canvas = FigureCanvasAgg(self.figure)
        self._images, self._background = [], None
        for p, matrix in enumerate(maps):
            row, col = divmod(p, cols)
            x, y = left + col * (width + GAP), fig_h - head - (row + 1) * row_h + bottom
            ax = self.figure.add_axes((x / fig_w, y / fig_h, width / fig_w, height / fig_h))
            self._images.append(
                ax.imshow(matrix, vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto")
            )
            ax.set_xticks(range(S), src_tokens if p + cols >= P else [], rotation=90, fontsize=8)
            ax.set_yticks(range(T), tgt_tokens if col == 0 else [], fontsize=8)
            if P > 1:
                last = "mean" if self.head is None else f"aligned: head {self.head}"
                ax.set_title(last if p == P - 1 else f"head {p}", fontsize=9)
        bar_y = fig_h - head - rows * row_h + bottom
        bar_box = (fig_w - BAR + 0.05, bar_y, 0.15, fig_h - head - top - bar_y)  # inches
        bar = self.figure.add_axes(
            tuple(v / s for v, s in zip(bar_box, (fig_w, fig_h) * 2, strict=True))
        )
        self.figure.colorbar(self._images[0], cax=bar)
        if title:
            self.figure.suptitle(title, y=1 - 0.08 / fig_h, va="top", fontsize=9)

    def update(self, weights: Tensor | np.ndarray) -> None:
        """Swap in new weights of the same shape, (T, [N,] S)."""
        maps = panels(weights, self.head)  # (P, T, S)
        if maps.shape != (len(self._images), *self._images[0].get_array().shape):
            raise ValueError(f"weights of shape {tuple(weights.shape)} do not fit this plot")
        for image, matrix in zip(self._images, maps, strict=True):
            image.set_data(matrix)

    def render(self) -> np.ndarray:
        """The figure as an RGB image (H, W, 3) uint8, e.g. for `SummaryWriter.add_image`."""
        layers = [a for image in self._images for a in (image, *image.axes.spines.values())]
        if self._background is None:  # everything but the heatmaps and their frames, drawn once
            for artist in layers:
                artist.set_visible(False)
            self._canvas.draw()
            self._background = self._canvas.copy_from_bbox(self.figure.bbox)
            for artist in layers:
                artist.set_visible(True)
        self._canvas.restore_region(self._background)
        for artist in layers:  # in drawing order: a heatmap, then the frame on top of it
            artist.axes.draw_artist(artist)
        return np.asarray(self._canvas.buffer_rgba())[..., :3].copy()  # (H, W, 3); outlives redraws


def alignment_figure(
    weights: Tensor | np.ndarray,
    src_tokens: list[str],
    tgt_tokens: list[str],
    title: str | None = None,
    head: int | None = None,
) -> Figure:
    """Heatmap(s) of weights (T, [N,] S) with subword tick labels and a 0..1 colour bar (see
    `AlignmentPlot`). The figure is at least 200 px wide; render it with `figure_to_array` or save it
    with `save_figure`."""
    return AlignmentPlot(weights, src_tokens, tgt_tokens, title, head).figure


def figure_to_array(fig: Figure) -> np.ndarray:
    """Render a figure to an RGB image (H, W, 3) uint8."""
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()  # (H, W, 3); copy outlives the canvas


def side_by_side(images: list[np.ndarray], gap: int = 12) -> np.ndarray:
    """RGB images (H_i, W_i, 3) in one row, top-aligned on white, `gap` white pixels between them:
    (max H_i, sum W_i + gap * (len - 1), 3) uint8. For comparing figures of different sizes."""
    height = max(image.shape[0] for image in images)
    row = []
    for i, image in enumerate(images):
        padded = np.full((height, image.shape[1] + gap * (i > 0), 3), 255, np.uint8)
        padded[: image.shape[0], gap * (i > 0) :] = image  # (height, gap + W_i, 3)
        row.append(padded)
    return np.concatenate(row, axis=1)  # (height, sum W_i + gaps, 3)


def save_figure(fig: Figure, path: str | Path) -> Path:
    """Write a figure to `path` (format from the suffix, e.g. .png), making its folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    return path
