"""AttentionHeatmaps in training runs: the images a run writes, and a run that writes them trains
as one that does not."""

import contextlib
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from seq2seq.commands import train as train_command
from tests.conftest import tiny_train_args


def run_train(corpus: Path, root: Path, *extra: str) -> Path:
    """Train in-process for 60 updates in `root`; returns the run folder."""
    args = tiny_train_args(corpus, root / "runs", "--max-steps", "60", *extra)
    with contextlib.chdir(root):  # the data cache goes to ./data/cache
        assert train_command.main(args) == 0
    return root / "runs" / "rnn-additive" / "version_0"


@pytest.fixture(scope="module")
def heatmap_run(tiny_corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return run_train(tiny_corpus, tmp_path_factory.mktemp("heatmaps"), "--heatmap-every", "10")


def test_run_logs_heatmaps_at_many_steps(heatmap_run: Path) -> None:
    events = EventAccumulator(str(heatmap_run), size_guidance={"images": 0})  # 0: keep them all
    events.Reload()
    tags = events.Tags()["images"]
    assert {f"align/{i}" for i in range(4)} | {f"align/{i}/greedy" for i in range(4)} <= set(tags)
    for tag in tags:
        images = events.Images(tag)
        assert all(image.width >= 200 and image.height > 0 for image in images), tag
    teacher_steps = sorted({image.step for image in events.Images("align/0")})
    assert teacher_steps == [0, 10, 20, 30, 40, 50, 60]
    assert len({image.step for image in events.Images("align/0/greedy")}) >= 3  # --val-every 10


def test_heatmaps_do_not_change_training(
    heatmap_run: Path, tiny_corpus: Path, tmp_path: Path
) -> None:
    plain_run = run_train(tiny_corpus, tmp_path)  # --heatmap-every 0 from tiny_train_args

    def weights(run: Path) -> dict[str, torch.Tensor]:
        return torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]

    with_heatmaps, without = weights(heatmap_run), weights(plain_run)
    assert with_heatmaps.keys() == without.keys()
    assert all(torch.equal(with_heatmaps[k], without[k]) for k in without)
