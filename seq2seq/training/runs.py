"""The run folder a training run writes to or resumes in, and the Lightning side of its checkpoints.

`AtomicCheckpointIO` routes Lightning's saves through `seq2seq.checkpoint.atomic_save` (Lightning's own
save goes through fsspec, whose local transaction stages the file in the system temp folder and moves it
over: a copy, not a rename, when that folder is another filesystem, and never fsynced).
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO

from seq2seq.atomic import TEMP_SUFFIX
from seq2seq.checkpoint import atomic_save, read_checkpoint
from seq2seq.cli import per_model_fields
from seq2seq.data.config import order_fields
from seq2seq.data.datamodule import (
    changed_message,
    check_same_order,
    order_changes,
)
from seq2seq.errors import UserError
from seq2seq.models.build import complete_args, model_args_from


def remove_stale_temporaries(folder: str | Path) -> list[Path]:
    """Delete temporary files that a killed `atomic_save` left in `folder`; returns them."""
    stale = sorted(Path(folder).glob(f".*.ckpt.*{TEMP_SUFFIX}"))
    for path in stale:
        path.unlink(missing_ok=True)
    return stale


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint I/O with an atomic save; loading and removal are Lightning's own."""

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any | None = None
    ) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options")
        try:
            atomic_save(checkpoint, path)
        except OSError as err:  # a full disk, a quota: the previous checkpoint is kept as it was
            raise UserError(f"{path}: cannot write the checkpoint ({err.strerror})") from None


class LastCheckpoint(ModelCheckpoint):
    """`last.ckpt`: the newest training state, rewritten at every validation and when training ends.

    Lightning's `save_last=True` rewrites last.ckpt only when a top-k checkpoint is saved, that is when
    the monitored score improves; resuming needs the newest state whatever the score.
    """

    def __init__(self, dirpath: str | Path) -> None:
        super().__init__(
            dirpath=dirpath,
            filename="last",
            monitor=None,  # with save_top_k=1: one file, replaced at every validation
            save_top_k=1,
            enable_version_counter=False,  # a resumed run rewrites last.ckpt, never last-v1.ckpt
        )

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Steps after the last validation (max_steps not a multiple of val_every) are kept too.
        if not self._should_skip_saving_checkpoint(trainer):
            self._save_topk_checkpoint(trainer, self._monitor_candidates(trainer))


def checkpoint_callbacks(
    dirpath: str | Path, keep_best: int, keep_last: int = 0
) -> list[ModelCheckpoint]:
    """`best-<step>.ckpt` (the `keep_best` highest validation BLEUs), `recent-<step>.ckpt` (the
    `keep_last` latest validations, none when 0) and `last.ckpt` in `dirpath`.

    Only `last.ckpt`, which a resume reads, carries the optimizer's state (twice the weights, with
    Adam's two moments); the best and recent ones are read only to score, average and translate,
    and hold the weights with what `seq2seq.checkpoint` needs beside them (model arguments,
    tokenizer, hyper-parameters), written by `TranslationSystem.on_save_checkpoint` either way.

    An explicit `dirpath` is stored resolved (Lightning applies realpath), so a resumed run finds the
    same folder in the checkpoint's callback state and carries on its best-BLEU tracking.
    """
    best = ModelCheckpoint(
        dirpath=dirpath,
        monitor="val/bleu",
        mode="max",
        filename="best-{step}",
        save_top_k=keep_best,
        auto_insert_metric_name=False,  # "val/bleu=" in a file name would make a subfolder
        save_weights_only=True,
        save_on_train_epoch_end=False,  # after a validation only (as recent-<step>.ckpt below)
    )
    callbacks = [best]
    if keep_last > 0:  # Lightning offers "step" to every monitor: the highest steps are the latest
        callbacks.append(
            ModelCheckpoint(
                dirpath=dirpath,
                monitor="step",
                mode="max",
                filename="recent-{step}",
                save_top_k=keep_last,
                auto_insert_metric_name=False,
                save_weights_only=True,
                # After each validation only: with one an epoch, Lightning would also save at the
                # end of a last epoch cut short by --max-steps, which was never validated (and
                # best-<step>.ckpt there with the previous validation's BLEU).
                save_on_train_epoch_end=False,
            )
        )
    return [*callbacks, LastCheckpoint(dirpath)]


@dataclass(frozen=True)
class RunFolder:
    """Where a run logs: `save_dir/name/version_N`; `version` None means the next free N."""

    save_dir: str
    name: str
    version: int | None = None

    @property
    def path(self) -> Path:
        """The version folder, or the run folder above it while N is not chosen yet."""
        run_dir = Path(self.save_dir) / self.name
        return run_dir if self.version is None else run_dir / f"version_{self.version}"


def latest_checkpoint(run_dir: str | Path) -> Path:
    """`run_dir/version_N/checkpoints/last.ckpt` of the highest N that has one."""
    versions = []
    for folder in Path(run_dir).glob("version_*"):
        number = folder.name.removeprefix("version_")
        if number.isdigit() and (folder / "checkpoints" / "last.ckpt").is_file():
            versions.append((int(number), folder))
    if not versions:
        raise UserError(
            f"`resume`: nothing to resume in {run_dir} (no version_N/checkpoints/last.ckpt)"
        )
    return max(versions)[1] / "checkpoints" / "last.ckpt"


def resume_plan(log_dir: str, name: str, resume: str | None) -> tuple[RunFolder, Path | None]:
    """The run folder to log into and the checkpoint to resume from (None: a fresh run).

    `resume` is None, "latest" (the newest run under `log_dir/name`) or a checkpoint path. A checkpoint
    inside `<save_dir>/<name>/version_N/checkpoints/` continues that very folder, so TensorBoard curves,
    best-BLEU tracking and checkpoints carry on where they stopped; one from anywhere else starts the
    next version under `log_dir/name`.
    """
    if resume is None:
        return RunFolder(log_dir, name), None
    path = latest_checkpoint(Path(log_dir) / name) if resume == "latest" else Path(resume)
    if not path.exists():
        raise UserError(f"`resume` {resume}: no such checkpoint")
    if not path.is_file():
        raise UserError(f"`resume` {resume}: a folder, not a checkpoint file")
    version_dir = path.parent.parent
    number = version_dir.name.removeprefix("version_")
    if path.parent.name == "checkpoints" and version_dir.name != number and number.isdigit():
        run_dir = version_dir.parent
        return RunFolder(str(run_dir.parent), run_dir.name, int(number)), path
    return RunFolder(log_dir, name), path


def read_resumable(path: str | Path) -> dict[str, Any]:
    """A checkpoint that training can continue from; a truncated, foreign or weights-only one is a
    UserError naming it (checked before any data is prepared)."""
    checkpoint = read_checkpoint(path)
    if any(key not in checkpoint for key in ("global_step", "loops", "optimizer_states")):
        raise UserError(
            f"{path}: holds weights only, no training state to resume (resume from the run's "
            "last.ckpt)"
        )
    return checkpoint


def check_fits(system: L.LightningModule, tokenizer: bytes, checkpoint: dict, path: Path) -> None:
    """Refuse to resume into a model or tokenizer other than the checkpoint's (changed flags or data)."""
    if checkpoint["tokenizer"] != tokenizer:
        raise UserError(
            f"{path}: trained with another tokenizer; resume with the same corpus, `src`, `tgt`, "
            "`vocab_size` and `limit_train_pairs`"
        )
    ours, theirs = system.state_dict(), checkpoint["state_dict"]
    wrong = sorted(k for k in ours.keys() & theirs.keys() if ours[k].shape != theirs[k].shape)
    odd = sorted(ours.keys() ^ theirs.keys())
    if wrong or odd:
        if wrong:
            name = wrong[0]
            detail = f"{name} is {tuple(theirs[name].shape)} there, {tuple(ours[name].shape)} here"
        else:
            detail = f"{odd[0]} is {'missing there' if odd[0] in ours else 'unknown here'}"
        more = len(wrong) + len(odd) - 1
        detail += f", and {more} more" if more else ""
        raise UserError(
            f"{path}: its weights do not fit the model these flags build ({detail}); "
            "resume with the flags it was trained with"
        )


def check_same_model(cfg: Any, checkpoint: dict, path: Path) -> None:
    """Refuse to resume `checkpoint` into another model than it holds: `score` dot and scaled, or
    two layers that read the same weights, fit the same tensors, and the run would go on as what it
    is not. The recipe's settings whose defaults follow `model` are `check_same_recipe`'s."""
    theirs = complete_args(checkpoint["model_args"])
    ours = complete_args(model_args_from(cfg, theirs["vocab_size"]))
    recipe = per_model_fields(type(cfg))
    changed = [
        (name, theirs.get(name), value)
        for name, value in ours.items()
        if name not in recipe and theirs.get(name) != value
    ]
    if theirs["model"] != ours["model"]:
        changed = [("model", theirs["model"], ours["model"])]  # not each of its sizes too
    if changed:
        raise UserError(
            f"{changed_message(path, changed)}; resume with the flags it was trained with: these "
            "build another model"
        )


# What a checkpoint written before a recipe setting existed trained with (word dropout came in 0.2.0).
BEFORE_IT_EXISTED = {"word_dropout": 0.0}


def check_same_recipe(cfg: Any, world_size: int, checkpoint: dict, path: Path) -> None:
    """Refuse to resume `checkpoint` with other values of the recipe's settings (`seq2seq.recipes`)
    than it trained with, whether given or defaulted: their defaults follow `model` and changed in
    0.3.0 and 0.4.0, and a resumed run must go on as it began. `max_epochs` may change (a run can be
    given more epochs); `batch_tokens`, which fixes the batch order, is `check_same_order`'s, and is
    named here too when it changed with the others, so that one refusal names every flag to give."""
    saved = {
        **BEFORE_IT_EXISTED,
        **(checkpoint.get("hyper_parameters") or {}),
        **checkpoint["model_args"],
    }
    order = order_changes(cfg, world_size, checkpoint)
    names = [
        n for n in per_model_fields(type(cfg)) if n != "max_epochs" and n not in order_fields()
    ]
    changed = [
        (n, saved[n], getattr(cfg, n)) for n in names if n in saved and saved[n] != getattr(cfg, n)
    ]
    if changed:
        *first, last = (f"`{n}`" for n in per_model_fields(type(cfg)))
        raise UserError(
            f"{changed_message(path, [*order, *changed])}; resume with the same settings: a run "
            f"keeps its recipe (the defaults of {', '.join(first)} and {last} follow `model`, and "
            "changed in seq2seq 0.3.0 and 0.4.0)"
        )
    check_same_order(cfg, world_size, checkpoint, path)
