"""Train a translator: `python scripts/train.py --score additive` (see --help for every flag)."""

import dataclasses
import sys
import warnings

from seq2seq.config import TrainConfig, parse_args
from seq2seq.errors import UserError


def build_trainer(cfg: TrainConfig, callbacks: list, logger) -> "L.Trainer":  # noqa: F821
    import lightning as L

    val_kwargs = (
        {"val_check_interval": cfg.val_every, "check_val_every_n_epoch": None}
        if cfg.val_every
        else {"check_val_every_n_epoch": 1}
    )
    return L.Trainer(
        accelerator=cfg.accelerator,
        devices=int(cfg.devices) if cfg.devices.isdigit() else cfg.devices,
        strategy=cfg.strategy,
        precision=cfg.precision,
        max_epochs=cfg.max_epochs,
        max_steps=cfg.max_steps,
        logger=logger,
        callbacks=callbacks,
        num_sanity_val_steps=0,
        use_distributed_sampler=False,  # the data module shards its own token-budget batches
        log_every_n_steps=min(50, max(1, (cfg.val_every or 150) // 3)),
        **val_kwargs,
    )


def main(argv: list[str] | None = None) -> int:
    try:
        cfg = parse_args(argv)
        return train(cfg)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


def train(cfg: TrainConfig) -> int:
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.loggers import TensorBoardLogger

    from seq2seq.callbacks import AttentionHeatmaps, TokensPerSecond
    from seq2seq.data import TranslationDataModule
    from seq2seq.system import TranslationSystem

    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    dm = TranslationDataModule(
        corpus=cfg.dataset,
        data_dir=cfg.data_dir,
        src_lang=cfg.src,
        tgt_lang=cfg.tgt,
        vocab_size=cfg.vocab_size,
        limit_train_pairs=cfg.limit_train_pairs,
        batch_tokens=cfg.batch_tokens,
        max_len=cfg.max_len,
        seed=cfg.seed,
        num_workers=cfg.num_workers,
    )
    dm.prepare_data()
    dm.setup("fit")
    system = TranslationSystem(dataclasses.asdict(cfg), dm.vocab_size)
    system.tokenizer = dm.tokenizer
    logger = TensorBoardLogger(cfg.log_dir, name=cfg.name, default_hp_metric=False)
    checkpoints = ModelCheckpoint(
        monitor="val/bleu",
        mode="max",
        filename="best-{step}",
        auto_insert_metric_name=False,
        save_last=True,
    )
    callbacks = [checkpoints, TokensPerSecond()]
    if cfg.heatmap_every > 0:
        callbacks.append(AttentionHeatmaps(cfg.heatmap_every, cfg.heatmap_sentences))
    trainer = build_trainer(cfg, callbacks, logger)
    if trainer.is_global_zero:
        print(
            f"Logging to {logger.log_dir}; watch it with:\n"
            f"  tensorboard --logdir {cfg.log_dir} --samples_per_plugin images=1000"
        )
    trainer.fit(system, datamodule=dm)
    return 0


if __name__ == "__main__":
    sys.exit(main())
