"""scripts/plot_attention.py's panels, side by side, align on their tops over white; its image is
checked before any work and written whole (the command on a trained checkpoint, its TensorBoard
images too: tests/e2e/test_plot_attention.py)."""

import os
from pathlib import Path

import numpy as np
import pytest

from seq2seq.alignment.plotting import side_by_side
from seq2seq.commands import plot_attention
from tests.conftest import write_corpus


def test_side_by_side_tops_align_on_white() -> None:
    tall, short = np.zeros((5, 2, 3), np.uint8), np.full((3, 4, 3), 7, np.uint8)
    row = side_by_side([tall, short], gap=1)
    assert row.shape == (5, 2 + 1 + 4, 3)
    assert (row[:, 2] == 255).all() and (row[3:, 3:] == 255).all() and (row[:3, 3:] == 7).all()


def test_an_image_format_matplotlib_cannot_write_is_refused_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "figure.xyz"
    assert plot_attention.main([str(tmp_path / "never-read.ckpt"), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: --out {out}: cannot write .xyz images (give a .png)"


def test_a_write_that_fails_before_its_fsync_leaves_the_old_image(
    premove_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.chdir(tmp_path)
    write_corpus(tmp_path / "corpus")  # the corpus the checkpoint names
    out = tmp_path / "figure.png"
    out.write_bytes(b"the old image")

    def full_disk(fd: int) -> None:
        raise OSError(28, os.strerror(28))

    monkeypatch.setattr(os, "fsync", full_disk)  # seq2seq.atomic fsyncs before it renames
    argv = [str(premove_checkpoint), "--split", "test", "--out", str(out)]
    assert plot_attention.main(argv) == 2
    assert (
        capsys.readouterr().err.strip() == f"error: --out {out}: cannot write ({os.strerror(28)})"
    )
    assert out.read_bytes() == b"the old image"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus", "figure.png"]
