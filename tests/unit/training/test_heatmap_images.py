"""seq2seq.training.heatmap_images called with values: training's heatmap images of a checkpoint, at
its step (logged into TensorBoard by the command: tests/e2e/test_plot_attention.py)."""

from pathlib import Path

import numpy as np
import pytest

from seq2seq.decoding.attention_figure import PairChoice
from seq2seq.training.heatmap_images import HeatmapImages, heatmap_images
from tests.conftest import write_corpus


def test_the_images_training_logs_at_the_checkpoints_step(
    premove_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    corpus = write_corpus(tmp_path / "other")
    found = heatmap_images(premove_checkpoint, PairChoice(split="val", data_dir=str(corpus)), 1)
    assert isinstance(found, HeatmapImages) and found.step == 20  # written after 20 updates
    assert [tag for tag, _ in found.images] == ["align/0", "align/0/greedy"]
    for _, image in found.images:
        assert image.ndim == 3 and image.shape[2] == 3 and image.dtype == np.uint8
