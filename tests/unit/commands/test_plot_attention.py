"""scripts/plot_attention.py's panels, side by side, align on their tops over white (the command on
a trained checkpoint: tests/e2e/test_plot_attention.py)."""

import numpy as np

from seq2seq.alignment.plotting import side_by_side


def test_side_by_side_tops_align_on_white() -> None:
    tall, short = np.zeros((5, 2, 3), np.uint8), np.full((3, 4, 3), 7, np.uint8)
    row = side_by_side([tall, short], gap=1)
    assert row.shape == (5, 2 + 1 + 4, 3)
    assert (row[:, 2] == 255).all() and (row[3:, 3:] == 255).all() and (row[:3, 3:] == 7).all()
