"""scripts/plot_attention.py on the trained tiny checkpoint: one panel per checkpoint, side by side;
training's heatmaps into a TensorBoard run; a bad index is one line."""

from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from seq2seq.commands import plot_attention


def test_each_checkpoint_adds_a_panel_to_the_right(tiny_checkpoint: Path, tmp_path: Path) -> None:
    one, three = tmp_path / "one.png", tmp_path / "three.png"
    ckpt = str(tiny_checkpoint)
    assert plot_attention.main([ckpt, "--index", "3", "--out", str(one)]) == 0
    assert plot_attention.main([ckpt, ckpt, ckpt, "--index", "3", "--out", str(three)]) == 0
    panel, row = imread(one), imread(three)
    assert row.shape[0] == panel.shape[0] and row.shape[1] == 3 * panel.shape[1] + 2 * 12
    np.testing.assert_array_equal(row[:, : panel.shape[1]], panel)  # the same panel, leftmost
    # The model's own translation has other rows than the reference: another picture.
    beam = tmp_path / "beam.png"
    assert plot_attention.main([ckpt, "--index", "3", "--beam", "2", "--out", str(beam)]) == 0
    assert imread(beam).shape != panel.shape or not np.array_equal(imread(beam), panel)


def test_tensorboard_gets_the_images_training_logs(tiny_checkpoint: Path, tmp_path: Path) -> None:
    argv = [str(tiny_checkpoint), "--tensorboard", str(tmp_path / "tb"), "--sentences", "3"]
    assert plot_attention.main(argv) == 0
    events = EventAccumulator(str(tmp_path / "tb" / tiny_checkpoint.stem))
    events.Reload()
    tags = sorted(events.Tags()["images"])
    assert tags == sorted(
        [f"align/{i}" for i in range(3)] + [f"align/{i}/greedy" for i in range(3)]
    )
    assert not list(tmp_path.glob("*.png"))  # no --out: no image file


def test_an_index_past_the_split_is_refused_in_one_line(
    tiny_checkpoint: Path, tmp_path: Path, capsys
) -> None:
    out = tmp_path / "never.png"
    assert plot_attention.main([str(tiny_checkpoint), "--index", "20", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: --index 20:")
    assert "has 20 pairs, numbered 0 to 19" in err and not out.exists()


def test_a_foresight_head_logs_its_reading_beside_each_image(
    tiny_checkpoint: Path, tmp_path: Path
) -> None:
    from seq2seq.commands import foresight

    fitted = tmp_path / "fs.ckpt"
    argv = [str(tiny_checkpoint), "--out", str(fitted), "--steps", "2", "--batch-tokens", "200"]
    assert foresight.main(argv) == 0
    argv = [str(fitted), "--tensorboard", str(tmp_path / "tb"), "--sentences", "2"]
    assert plot_attention.main(argv) == 0
    events = EventAccumulator(str(tmp_path / "tb" / "fs"))
    events.Reload()
    tags = sorted(events.Tags()["images"])
    kinds = ["", "/foresight", "/greedy", "/greedy/foresight"]
    assert tags == sorted(f"align/{i}{kind}" for i in range(2) for kind in kinds)
    image = events.Images("align/0/foresight")[0]
    assert image.step == events.Images("align/0")[0].step and image.height >= 100


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--sentences", "3", "--out", "{tmp}/x.png"], "--sentences is for --tensorboard's images"),
        (["--beam", "2", "--tensorboard", "{tmp}/tb"], "--beam is for the --out image"),
        (["--index", "5", "--tensorboard", "{tmp}/tb"], "--index is for the --out image"),
        (["--src", "fr", "--out", "{tmp}/x.png"], "--src fr: the checkpoint translates de->en"),
        (
            ["--tgt", "cs", "--tensorboard", "{tmp}/tb"],
            "--tgt cs: the checkpoint translates de->en",
        ),
    ],
)
def test_a_flag_nothing_reads_or_another_language_is_refused_before_any_work(
    tiny_checkpoint: Path, tmp_path: Path, capsys, flags: list[str], said: str
) -> None:
    argv = [str(tiny_checkpoint), *(flag.format(tmp=tmp_path) for flag in flags)]
    assert plot_attention.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"error: {said}"), err
    assert list(tmp_path.iterdir()) == []  # no image, no TensorBoard run
