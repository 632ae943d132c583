"""A run's TensorBoard folder read back: its scalars sitting by sitting, the wall time and speed a
study reports (docs/tools/score_curves.py reads the attention statistics through it too), and
the precision its hparams.yaml records."""

from pathlib import Path
from typing import Any


def sittings_scalars(version_dir: Path) -> list[dict[str, list[tuple[int, float, float]]]]:
    """The scalars of a run's TensorBoard events, one dict per events file (each sitting writes
    one, in time order): tag -> [(step, wall time, value), ...]."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sittings = []
    for events_file in sorted(version_dir.glob("events.out.tfevents.*")):
        events = EventAccumulator(str(events_file), size_guidance={"scalars": 0})  # 0: keep all
        events.Reload()
        sittings.append(
            {
                tag: [(e.step, e.wall_time, e.value) for e in events.Scalars(tag)]
                for tag in events.Tags()["scalars"]
            }
        )
    return sittings


def training_figures(version_dir: Path) -> dict[str, Any]:
    """Wall time (every sitting's first to last event, summed) and the mean of train/tokens_per_sec."""
    seconds, speeds = 0.0, []
    for scalars in sittings_scalars(version_dir):
        times = [wall for points in scalars.values() for _, wall, _ in points]
        if times:
            seconds += max(times) - min(times)
        speeds += [value for _, _, value in scalars.get("train/tokens_per_sec", [])]
    return {
        "train_hours": seconds / 3600,
        "tokens_per_sec": sum(speeds) / len(speeds) if speeds else None,
    }


def trained_precision(version_dir: Path) -> str | None:
    """The precision the run began in, as train.py resolved it (`auto` made a Lightning name) into
    hparams.yaml, which Lightning writes at a run's first start only; a resumed run keeps it unless
    its command names another. None where that file or key is missing."""
    import yaml

    path = version_dir / "hparams.yaml"
    if not path.is_file():
        return None
    return (yaml.safe_load(path.read_text("utf-8")) or {}).get("precision")


def run_curves(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(update, value)] over every sitting of a training run folder, by update; a value
    logged twice for one update (a resumed sitting repeating a validation) keeps the later one."""
    versions = sorted(run_dir.glob("version_*"))
    merged: dict[str, dict[int, float]] = {}
    for scalars in sittings_scalars(versions[-1]) if versions else []:
        for tag, points in scalars.items():
            merged.setdefault(tag, {}).update({step: value for step, _, value in points})
    return {tag: sorted(points.items()) for tag, points in merged.items()}
