"""The phases of a training run, in the order `seq2seq.training.run.train` calls them, each one step a
profile or a traceback can name: plan the run (`plan_run`), its callbacks (`run_callbacks`) and
Trainer (`build_trainer`, `check_trainer`), the prepared data (`prepared_data`), the system to train (`system_for`),
then `fit` and what the run ends with (`report_end`).

Everything here imports Lightning and torch; `run.py` imports this module only when a run begins,
so a bad flag is refused before those imports.
"""

import dataclasses
import logging
import os
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger

from seq2seq.atomic import check_writable
from seq2seq.checkpoint import CORPUS_KEYS
from seq2seq.cli import part
from seq2seq.data.datamodule import TranslationDataModule, check_same_corpus
from seq2seq.data.prepare import prepare
from seq2seq.errors import Stopped
from seq2seq.models.build import build_model, model_args_from
from seq2seq.models.kernels import KERNELS
from seq2seq.training.callbacks import AlignmentErrorRate, AttentionHeatmaps, TokensPerSecond
from seq2seq.training.config import OptimConfig, TrainConfig, ValidationConfig, validate
from seq2seq.training.guards import NonFiniteLossGuard
from seq2seq.training.launch import (
    check_hardware,
    resolve_precision,
    slow_precision,
    trainer_error,
)
from seq2seq.training.progress import RunEstimate, RunProgressBar
from seq2seq.training.runs import (
    AtomicCheckpointIO,
    RunFolder,
    check_fits,
    check_same_model,
    check_same_recipe,
    checkpoint_callbacks,
    read_resumable,
    remove_stale_temporaries,
    resume_plan,
)
from seq2seq.training.stops import PoliteStop
from seq2seq.training.system import TranslationSystem

# Lines of Lightning's start-up a user cannot act on (the GPU line stays: a user can ask for one).
QUIET = ("💡 Tip:", "TPU available", "HPU available", "Loading `train_dataloader` to estimate")


def _worth_reading(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith(QUIET)


def quiet_lightning() -> None:
    """Leave out what Lightning says that a user cannot act on. No flag or variable turns its
    adverts off (Lightning-AI/pytorch-lightning#21294); its console loggers are the documented
    handle on what it prints."""
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(_worth_reading)
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    # Validation metrics come from outputs gathered across ranks: every rank logs the same value.
    warnings.filterwarnings("ignore", ".*sync_dist=True.*")
    # Deprecations raised from Lightning's own modules are Lightning's to fix, not the user's.
    for category in (DeprecationWarning, FutureWarning):
        warnings.filterwarnings("ignore", category=category, module=r"lightning\.")


@dataclass
class Plan:
    """What a run is before any data work: its settings (validated, `auto` precision made
    concrete), where it logs, and the checkpoint it resumes (None: a fresh run)."""

    cfg: TrainConfig
    folder: RunFolder
    logger: TensorBoardLogger
    ckpt_path: Path | None = None
    checkpoint: dict[str, Any] | None = None  # dropped once checked: fit reads the file again
    resumed_step: int | None = None
    slow: str | None = None  # a warning about a slow precision

    @property
    def ckpt_dir(self) -> str:
        return os.path.join(self.logger.log_dir, "checkpoints")


def plan_run(cfg: TrainConfig) -> Plan:
    """Refuse bad input before any data work: the settings (a library caller's TrainConfig has not
    been through parse_args), the hardware flags, the run folder, the checkpoint to resume."""
    cfg = validate(cfg)
    check_hardware(cfg.accelerator, cfg.devices, cfg.strategy, cfg.precision)
    folder, ckpt_path = resume_plan(cfg.log_dir, cfg.name, cfg.resume)
    flag = f"--log-dir {cfg.log_dir}" if folder.version is None else f"--resume {ckpt_path}"
    check_writable(folder.path, flag)
    checkpoint = read_resumable(ckpt_path) if ckpt_path else None
    if checkpoint is not None:
        check_same_model(cfg, checkpoint, ckpt_path)
    # `auto` becomes a Lightning name here (a resumed run keeps its own), so hparams.yaml and the
    # checkpoints say what ran.
    precision = resolve_precision(cfg.accelerator, cfg.precision, checkpoint)
    cfg = dataclasses.replace(cfg, precision=precision)
    # version=None: the next version_N; a resumed run keeps logging into its own version folder.
    logger = TensorBoardLogger(
        folder.save_dir, name=folder.name, version=folder.version, default_hp_metric=False
    )
    slow = slow_precision(cfg.accelerator, cfg.precision)
    step = checkpoint["global_step"] if checkpoint is not None else None
    return Plan(cfg, folder, logger, ckpt_path, checkpoint, step, slow)


def run_callbacks(cfg: TrainConfig, ckpt_dir: str, stop: PoliteStop) -> list[L.Callback]:
    """Checkpoints, the polite stop, the guards, the logged extras and what the user watches."""
    callbacks = [
        *checkpoint_callbacks(ckpt_dir, cfg.keep_best, cfg.keep_last),
        stop,
        TokensPerSecond(),
        NonFiniteLossGuard(),
        AlignmentErrorRate(),  # val/aer, when the corpus has a gold <val split>.align file
        RunEstimate(cfg.val_every),
        RunProgressBar(),
    ]
    if cfg.heatmap_every > 0:
        callbacks.append(AttentionHeatmaps(cfg.heatmap_every, cfg.heatmap_sentences))
    if cfg.patience > 0:
        mode = "min" if cfg.patience_metric == "loss" else "max"  # val/loss or val/bleu
        callbacks.append(
            EarlyStopping(f"val/{cfg.patience_metric}", mode=mode, patience=cfg.patience)
        )
    return callbacks


def build_trainer(cfg: TrainConfig, callbacks: list[L.Callback], logger: Any) -> L.Trainer:
    """The Trainer; Lightning judges the hardware flags here, still before any data work."""
    # Lightning counts batches here, not updates: each update is accumulate_grad_batches of them.
    if cfg.val_every:
        every = cfg.val_every * cfg.accumulate_grad_batches
        validation = {"val_check_interval": every, "check_val_every_n_epoch": None}
    else:
        validation = {"check_val_every_n_epoch": 1}
    try:
        return L.Trainer(
            accelerator=cfg.accelerator,
            devices=int(cfg.devices) if cfg.devices.isdigit() else cfg.devices,
            num_nodes=cfg.num_nodes,
            strategy=cfg.strategy,
            precision=cfg.precision,
            max_epochs=cfg.max_epochs,
            max_steps=cfg.max_steps,
            accumulate_grad_batches=cfg.accumulate_grad_batches,
            logger=logger,
            callbacks=callbacks,
            plugins=[AtomicCheckpointIO()],  # a kill during a save keeps the previous checkpoint
            num_sanity_val_steps=0,
            use_distributed_sampler=False,  # the data module shards its own token-budget batches
            log_every_n_steps=min(50, max(1, (cfg.val_every or 150) // 3)),
            # Its table names the kernel classes the model runs on (`model_line` names the model).
            enable_model_summary=False,
            **validation,
        )
    except Exception as err:  # its exceptions vary (MisconfigurationException, ValueError, ...)
        hardware = ("accelerator", "devices", "strategy", "precision", "num_nodes")
        raise trainer_error(err, {name: getattr(cfg, name) for name in hardware}) from None


def check_trainer(plan: Plan, trainer: L.Trainer) -> None:
    """What needs the Trainer's world size: a resumed run keeps its recipe and batch order; and
    the warning about a slow precision, once."""
    if plan.checkpoint is not None:
        check_same_recipe(plan.cfg, trainer.world_size, plan.checkpoint, plan.ckpt_path)
    if plan.slow and trainer.is_global_zero:
        print(plan.slow, file=sys.stderr)


def prepared_data(plan: Plan, trainer: L.Trainer, stop: PoliteStop) -> TranslationDataModule:
    """The tokenizer and the encoded corpus, built once (or read), then loaded."""
    cfg = plan.cfg
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    dm = TranslationDataModule(cfg, positions=cfg.positions)
    try:  # a stop ends the preparation between chunks, or the wait for another builder's lock
        prepare(cfg, dm.test_split, stop=stop.pending, budget=stop.spent)
    except Stopped as stopped:
        if trainer.is_global_zero:
            stop.mark(
                stopped, plan.resumed_step
            )  # a resumed run is still stopped at its checkpoint
        raise
    dm.setup("fit")
    return dm


def system_for(plan: Plan, dm: TranslationDataModule) -> TranslationSystem:
    """The model (its vocabulary size is known only now that the tokenizer exists), in the
    LightningModule that trains it; a resumed run's checkpoint must fit both."""
    cfg = plan.cfg
    model = build_model(model_args_from(cfg, dm.vocab_size))
    optim = part(cfg, OptimConfig)
    if not cfg.guided_alignment:  # no batch carries links: no guided-alignment loss
        optim.guided_alignment_weight = 0.0
    corpus = {key: getattr(cfg, key) for key in CORPUS_KEYS}
    validation = part(cfg, ValidationConfig)
    system = TranslationSystem(model, dm.tokenizer, optim, validation, corpus, cfg.compile)
    if plan.checkpoint is not None:
        check_same_corpus(dm, plan.checkpoint, plan.ckpt_path)
        check_fits(system, dm.tokenizer.to_bytes(), plan.checkpoint, plan.ckpt_path)
        plan.checkpoint = None  # fit reads the file again; free the memory
    return system


def model_line(model: Any) -> str:
    """The model in one line, by its textbook class (`accelerate` swaps in kernels that compute
    the same numbers under other names) and its size."""
    textbook = {kernel: plain for plain, kernel in KERNELS.items()}
    name = textbook.get(type(model), type(model)).__name__
    count = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    frozen = f", {count - trainable:,} frozen" if trainable != count else ""
    return f"Model: {name}, {count:,} parameters{frozen}"


def fit(
    plan: Plan, trainer: L.Trainer, system: TranslationSystem, dm: Any, stop: PoliteStop
) -> None:
    """Say where the run logs, then train: to its end, a stop, or a failure."""
    plan.logger.log_hyperparams(dataclasses.asdict(plan.cfg))  # the whole flag set, hparams.yaml
    if plan.ckpt_path is not None:
        warnings.filterwarnings("ignore", ".*exists and is not empty.*")  # it is ours, resumed
        # The data module resumes mid-epoch itself (its state_dict), which Lightning cannot see.
        warnings.filterwarnings("ignore", ".*dataloader is not resumable.*")
    if trainer.is_global_zero:
        if plan.ckpt_path is not None:
            remove_stale_temporaries(plan.ckpt_dir)  # left by a kill during a save
            print(f"Resuming {plan.ckpt_path} at step {plan.resumed_step}")
        print(model_line(system.model))
        print(
            f"Logging to {plan.logger.log_dir}; watch it with:\n"
            f"  tensorboard --logdir {plan.folder.save_dir} --samples_per_plugin images=1000"
        )
    if stop.requested:  # asked to stop while the data was read: nothing new to save
        stopped = Stopped(stop.requested, None, None)
        if trainer.is_global_zero:
            stop.mark(stopped, plan.resumed_step)
        raise stopped
    try:
        trainer.fit(system, datamodule=dm, ckpt_path=plan.ckpt_path)
    finally:
        # Lightning leaves its progress bars open when fit raises (a diverged run, a crash): close
        # them, or their last state is printed at interpreter exit, after our one-line error.
        for name in ("_train_progress_bar", "_val_progress_bar"):
            bar = getattr(trainer.progress_bar_callback, name, None)
            if bar is not None:
                bar.close()


def report_end(trainer: L.Trainer, started: float) -> str:
    """What a finished run says last: its time, its best checkpoint and validation BLEU, and the
    command that scores it on the test split."""
    minutes = (time.monotonic() - started) / 60
    done = f"Trained to update {trainer.global_step:,} in {minutes:.1f} min"
    best = next(
        (c for c in trainer.checkpoint_callbacks
         if isinstance(c, ModelCheckpoint) and c.monitor == "val/bleu" and c.best_model_path),
        None,
    )  # fmt: skip
    if best is None:
        return f"{done}; no validation BLEU was recorded, so no best checkpoint was kept"
    path = best.best_model_path
    return (
        f"{done}. Best checkpoint: {path} (validation BLEU {float(best.best_model_score):.2f}); "
        f"score it on the test split with:\n  python scripts/evaluate.py {path} --split test"
    )
