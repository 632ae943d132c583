"""Callbacks: non-essential measurements that training runs with or without."""

import time
from typing import Any

import lightning as L
import torch


class TokensPerSecond(L.Callback):
    """Logs `train/tokens_per_sec`: real target tokens per second of training, over each logging window.

    Token counts accumulate on the device and are read once per window, so there is no host sync per step.
    """

    def __init__(self) -> None:
        self._tokens: torch.Tensor | None = None
        self._start = 0.0

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._tokens is None:
            self._tokens = torch.zeros((), dtype=torch.long, device=pl_module.device)
            self._start = time.perf_counter()

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        self._tokens += batch["tgt_mask"].sum()
        if trainer.global_step % trainer.log_every_n_steps == 0:
            elapsed = time.perf_counter() - self._start
            pl_module.log("train/tokens_per_sec", float(self._tokens) / max(elapsed, 1e-9))
            self._tokens = None

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._tokens = None  # validation time is not training time: start a new window after it
