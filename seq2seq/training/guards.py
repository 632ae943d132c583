"""NonFiniteLossGuard: stop training at the first update whose loss or gradients are NaN or infinite.

Why before the optimizer step: the update that would write NaN into the weights has not happened yet,
and raising there means Lightning saves nothing more (no checkpoint on an exception), so the last
checkpoint on disk is the last good one.

Why the gradients and not only the loss: under DDP they are already all-reduced when the check runs,
so every rank sees the same verdict, and a finite loss with overflowing gradients (which would poison
the weights one step before the loss shows it) is caught too. The local loss joins the verdict through
a one-element all-reduce, so ranks never disagree and none is left waiting in a collective.

Host syncs: on CPU reading the verdict costs nothing and it is read at every update, so training stops
at the exact step with finite weights in memory. On an accelerator the verdict stays on the device
(the first bad step is recorded there) and is read every `check_every` updates and before every
validation, i.e. before every checkpoint save: one sync per `check_every` steps instead of per step.
"""

import os

import lightning as L
import torch
from torch import Tensor

from seq2seq.errors import TrainingDiverged


class NonFiniteLossGuard(L.Callback):
    """Raise `TrainingDiverged` naming the first update (1-based) with a non-finite loss or gradient."""

    def __init__(self, check_every: int = 50) -> None:
        self.check_every = check_every
        self._loss: Tensor | None = None
        self._bad_step: Tensor | None = None  # () long on the device; -1 while all is well

    def on_before_backward(
        self, trainer: L.Trainer, pl_module: L.LightningModule, loss: Tensor
    ) -> None:
        self._loss = loss.detach()

    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        finite = torch.isfinite(self._loss).all()
        # A grad scaler (fp16) makes inf gradients on purpose and skips those steps itself.
        if getattr(trainer.precision_plugin, "scaler", None) is None:
            grads = [p.grad for p in pl_module.parameters() if p.grad is not None]
            if grads:  # one fused kernel per device and dtype, as clip_grad_norm_ uses
                finite &= torch.stack(torch._foreach_norm(grads)).isfinite().all()
        if trainer.world_size > 1:
            flag = finite.to(torch.int32)
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MIN)
            finite = flag.bool()
        step = trainer.global_step + 1  # global_step counts the updates already made
        if self._bad_step is None:
            self._bad_step = torch.full((), -1, dtype=torch.long, device=finite.device)
        first = ~finite & (self._bad_step < 0)
        self._bad_step = torch.where(first, torch.full_like(self._bad_step, step), self._bad_step)
        if finite.device.type == "cpu" or step % self.check_every == 0:
            self._check(trainer)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._check(trainer)  # never validate, and so never checkpoint, poisoned weights

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._check(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._check(trainer)  # before LastCheckpoint's final save: checkpoint callbacks run last

    def _check(self, trainer: L.Trainer) -> None:
        if self._bad_step is None or (step := int(self._bad_step)) < 0:
            return
        raise TrainingDiverged(
            f"training diverged: the loss or its gradients are not finite at step {step} "
            f"(try a lower `lr`); last good checkpoint: {_last_checkpoint(trainer)}"
        )


def _last_checkpoint(trainer: L.Trainer) -> str:
    """The newest checkpoint file the run has written, for the message."""
    paths = [
        path
        for callback in trainer.checkpoint_callbacks
        for path in (callback.last_model_path, callback.best_model_path)
        if path and os.path.exists(path)
    ]
    return max(paths, key=os.path.getmtime) if paths else "none written yet"
