"""The training procedure: `train(cfg)` checks the flags, plans a resume, prepares the data, builds
the model and the Trainer, and fits; what `python -m seq2seq train` (seq2seq.commands.train) runs after
parsing the flags, and what a library caller runs with a `TrainConfig` of its own.

Exceptions carry the outcome: a `UserError` (bad input, exit status 2), `TrainingDiverged` (3) and
`Stopped` (a polite stop, 4) are raised for the caller to report; 0 is returned when the run ends.
"""

import dataclasses
import logging
import os
import signal
import sys
import typing
import warnings

from seq2seq.checkpoint import CORPUS_KEYS
from seq2seq.cli import part
from seq2seq.errors import Stopped
from seq2seq.training.config import OptimConfig, TrainConfig, ValidationConfig, validate

STOP_SIGNALS = [signal.SIGTERM, *(getattr(signal, f"SIG{name}") for name in typing.get_args(
    typing.get_type_hints(TrainConfig)["stop_signal"]))]  # fmt: skip


def build_trainer(cfg: TrainConfig, callbacks: list, logger) -> "L.Trainer":  # noqa: F821
    import lightning as L
    from lightning.pytorch.callbacks import TQDMProgressBar

    from seq2seq.training.runs import AtomicCheckpointIO

    val_kwargs = (
        # Lightning counts batches here, not updates: each update is accumulate_grad_batches of them.
        {
            "val_check_interval": cfg.val_every * cfg.accumulate_grad_batches,
            "check_val_every_n_epoch": None,
        }
        if cfg.val_every
        else {"check_val_every_n_epoch": 1}
    )
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
        # tqdm's bar whether or not `rich` is installed (import-linter brings it): Lightning would
        # pick its Rich bar then, which writes nothing to a log file until the run ends.
        callbacks=[*callbacks, TQDMProgressBar()],
        plugins=[AtomicCheckpointIO()],  # a kill during a save keeps the previous checkpoint
        num_sanity_val_steps=0,
        use_distributed_sampler=False,  # the data module shards its own token-budget batches
        log_every_n_steps=min(50, max(1, (cfg.val_every or 150) // 3)),
        **val_kwargs,
    )


def stop_message(stop: Stopped) -> str:
    """The one line a polite stop prints: why, what was saved, and how to go on."""
    if stop.step is None:
        return f"{stop.reason} before training began; nothing new to save"
    return (
        f"{stop.reason}: saved {stop.checkpoint} at update {stop.step}; continue with the same "
        f"command and --resume {stop.checkpoint}"
    )


def _no_tips(record: logging.LogRecord) -> bool:
    """False for Lightning's advert lines ("💡 Tip: ... try installing litlogger")."""
    return not record.getMessage().startswith("💡 Tip:")


def train(cfg: TrainConfig, started: float | None = None) -> int:
    """Train as `cfg` says; `started`: `time.monotonic()` when this process began (default: now)."""
    import lightning as L
    from lightning.pytorch.callbacks import EarlyStopping
    from lightning.pytorch.loggers import TensorBoardLogger

    from seq2seq.data.datamodule import TranslationDataModule, check_same_corpus
    from seq2seq.data.prepare import prepare
    from seq2seq.models.build import build_model, model_args_from
    from seq2seq.training.callbacks import AlignmentErrorRate, AttentionHeatmaps, TokensPerSecond
    from seq2seq.training.guards import NonFiniteLossGuard
    from seq2seq.training.launch import (
        check_hardware,
        resolve_precision,
        slow_precision,
        trainer_error,
    )
    from seq2seq.training.runs import (
        check_fits,
        check_same_recipe,
        check_writable,
        checkpoint_callbacks,
        read_resumable,
        remove_stale_temporaries,
        resume_plan,
    )
    from seq2seq.training.stops import PoliteStop
    from seq2seq.training.system import TranslationSystem

    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    # Validation metrics come from outputs gathered across ranks: every rank logs the same value.
    warnings.filterwarnings("ignore", ".*sync_dist=True.*")
    # bf16-mixed is the default on a CPU with native bf16; the summary's size estimate in fp32 is fine.
    warnings.filterwarnings("ignore", ".*not supported by the model summary.*")
    # No flag or variable turns Lightning's adverts off (Lightning-AI/pytorch-lightning#21294); its
    # console loggers are the documented handle on what it prints.
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(_no_tips)
    # Bad input is refused before any data work: the settings (a library caller's TrainConfig has
    # not been through parse_args), the hardware flags, the run folder, the checkpoint.
    validate(cfg)
    check_hardware(cfg.accelerator, cfg.devices, cfg.strategy, cfg.precision)
    folder, ckpt_path = resume_plan(cfg.log_dir, cfg.name, cfg.resume)
    flag = f"--log-dir {cfg.log_dir}" if folder.version is None else f"--resume {ckpt_path}"
    check_writable(folder.path, flag)
    checkpoint = read_resumable(ckpt_path) if ckpt_path else None
    # `auto` becomes a Lightning name here (a resumed run keeps its own), so hparams.yaml and the
    # checkpoints say what ran.
    cfg = dataclasses.replace(
        cfg, precision=resolve_precision(cfg.accelerator, cfg.precision, checkpoint)
    )
    slow = slow_precision(cfg.accelerator, cfg.precision)
    resumed_step = checkpoint["global_step"] if checkpoint is not None else None
    # version=None: the next version_N; a resumed run keeps logging into its own version folder.
    logger = TensorBoardLogger(
        folder.save_dir, name=folder.name, version=folder.version, default_hp_metric=False
    )
    ckpt_dir = os.path.join(logger.log_dir, "checkpoints")
    # Installed now, so a stop asked for while the data is prepared is not lost; it holds the signals
    # until this function ends (Lightning registers none of its own: seq2seq.training.stops).
    stop = PoliteStop(ckpt_dir, cfg.stop_signal, cfg.max_minutes, started)
    stop.install()
    try:
        callbacks = [
            *checkpoint_callbacks(ckpt_dir, cfg.keep_best, cfg.keep_last),
            stop,
            TokensPerSecond(),
            NonFiniteLossGuard(),
            AlignmentErrorRate(),  # val/aer, when the corpus has a gold <val split>.align file
        ]
        if cfg.heatmap_every > 0:
            callbacks.append(AttentionHeatmaps(cfg.heatmap_every, cfg.heatmap_sentences))
        if cfg.patience > 0:
            callbacks.append(EarlyStopping("val/bleu", mode="max", patience=cfg.patience))
        try:  # Lightning judges the hardware flags here: still before any data work
            trainer = build_trainer(cfg, callbacks, logger)
        except Exception as err:  # its exceptions vary (MisconfigurationException, ValueError, ...)
            hardware = ("accelerator", "devices", "strategy", "precision", "num_nodes")
            raise trainer_error(err, {name: getattr(cfg, name) for name in hardware}) from None
        if checkpoint is not None:
            check_same_recipe(cfg, trainer.world_size, checkpoint, ckpt_path)
        if slow and trainer.is_global_zero:
            print(slow, file=sys.stderr)
        L.seed_everything(cfg.seed, workers=True, verbose=False)
        dm = TranslationDataModule(cfg, positions=cfg.positions)
        try:  # a stop ends the preparation between chunks, or the wait for another builder's lock
            prepare(cfg, dm.test_split, stop=stop.pending, budget=stop.spent)
        except Stopped as stopped:
            if trainer.is_global_zero:
                stop.mark(stopped, resumed_step)  # a resumed run is still stopped at its checkpoint
            raise
        dm.setup("fit")
        # The vocabulary size is known only now that the tokenizer exists.
        model = build_model(model_args_from(cfg, dm.vocab_size))
        optim = part(cfg, OptimConfig)
        if not cfg.guided_alignment:  # no batch carries links: no guided-alignment loss
            optim.guided_alignment_weight = 0.0
        corpus = {key: getattr(cfg, key) for key in CORPUS_KEYS}
        validation = part(cfg, ValidationConfig)
        system = TranslationSystem(model, dm.tokenizer, optim, validation, corpus, cfg.compile)
        if checkpoint is not None:
            check_same_corpus(dm, checkpoint, ckpt_path)
            check_fits(system, dm.tokenizer.to_bytes(), checkpoint, ckpt_path)
            checkpoint = None  # fit reloads it; free memory
            warnings.filterwarnings("ignore", ".*exists and is not empty.*")  # it is ours, resumed
            # The data module resumes mid-epoch itself (its state_dict), which Lightning cannot see.
            warnings.filterwarnings("ignore", ".*dataloader is not resumable.*")
        logger.log_hyperparams(dataclasses.asdict(cfg))  # the whole flag set, in hparams.yaml
        if trainer.is_global_zero:
            if ckpt_path is not None:
                remove_stale_temporaries(ckpt_dir)  # left by a kill during a save
                print(f"Resuming {ckpt_path} at step {resumed_step}")
            print(
                f"Logging to {logger.log_dir}; watch it with:\n"
                f"  tensorboard --logdir {folder.save_dir} --samples_per_plugin images=1000"
            )
        if stop.requested:  # asked to stop while the data was read: nothing new to save
            stopped = Stopped(stop.requested, None, None)
            if trainer.is_global_zero:
                stop.mark(stopped, resumed_step)
            raise stopped
        try:
            trainer.fit(system, datamodule=dm, ckpt_path=ckpt_path)
        finally:
            # Lightning leaves its progress bars open when fit raises (a diverged run, a crash): close
            # them, or their last state is printed at interpreter exit, after our one-line error.
            for name in ("_train_progress_bar", "_val_progress_bar"):
                bar = getattr(trainer.progress_bar_callback, name, None)
                if bar is not None:
                    bar.close()
        return 0
    finally:
        # Also after a refusal or a stop before fit: a dead run's handler left in place would swallow
        # this process's next stop signal.
        stop.restore()
