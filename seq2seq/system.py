"""TranslationSystem: the LightningModule that wires a model to its loss, decoding, metrics and optimizer.

The model itself is a plain `nn.Module` (seq2seq.models); this class adds what training needs: the
label-smoothed loss over real target tokens, validation loss, perplexity and BLEU from the same search
code that evaluation uses, Adam with warm-up and cosine decay, gradient clipping, and the sentencepiece
model carried inside every checkpoint.
"""

import functools
import math
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch import Tensor

from seq2seq import __version__
from seq2seq.config import TrainConfig, config_from_dict
from seq2seq.errors import UserError
from seq2seq.metrics import attention_entropy, corpus_bleu, perplexity
from seq2seq.models import Seq2Seq, build_model
from seq2seq.search import translate_batch
from seq2seq.tokenizer import Tokenizer


def smoothed_nll(logits: Tensor, target: Tensor, smoothing: float) -> tuple[Tensor, Tensor]:
    """Label-smoothed cross-entropy and plain NLL, both summed. logits (N, V), target (N,).

    One log-softmax serves both: the loss to optimise and the NLL behind perplexity.
    """
    return SmoothedCrossEntropy.apply(logits, target, smoothing)


class SmoothedCrossEntropy(torch.autograd.Function):
    """`smoothed_nll` with a hand-written backward: one (N, V) buffer instead of autograd's chain.

    Autograd would differentiate the mean, the gather and the log-softmax one after the other, each with
    its own (N, V) tensor: with N of 2,000 tokens and V of 8,000 that is 64 MB apiece. The gradient in
    closed form is softmax(logits) - q, with q the smoothed target distribution.
    """

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, smoothing: float) -> tuple[Tensor, Tensor]:
        # At least fp32: bf16 logits (autocast) are widened; float64 (gradcheck) stays as it is.
        log_probs = logits.to(torch.promote_types(logits.dtype, torch.float32)).log_softmax(-1)
        nll = -log_probs.gather(1, target.unsqueeze(1)).squeeze(1)  # (N,)
        uniform = -log_probs.mean(-1)  # (N,) cross-entropy against the uniform distribution
        loss = (1.0 - smoothing) * nll + smoothing * uniform  # (N,)
        ctx.save_for_backward(log_probs, target)
        ctx.smoothing, ctx.logits_dtype = smoothing, logits.dtype
        return loss.sum(), nll.sum()

    @staticmethod
    def backward(ctx, grad_loss: Tensor, grad_nll: Tensor) -> tuple[Tensor, None, None]:
        log_probs, target = ctx.saved_tensors
        eps, vocab = ctx.smoothing, log_probs.size(-1)
        # d loss / d logits = p - (1 - eps) onehot - eps / V;  d nll / d logits = p - onehot.
        grad = log_probs.exp().mul_(grad_loss + grad_nll).sub_(grad_loss * (eps / vocab))  # (N, V)
        rows = torch.arange(len(target), device=target.device)  # (N,)
        grad[rows, target] -= grad_loss * (1.0 - eps) + grad_nll
        return grad.to(ctx.logits_dtype), None, None


def batch_loss(
    model: Seq2Seq, batch: dict[str, Tensor], label_smoothing: float
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Teacher-forced loss of a batch: smoothed loss sum, NLL sum, real token count, attention weights.

    The output layer runs once, on the real target positions only: padding costs no V-sized work.
    """
    state = model.encode(batch["src"], batch["src_lens"], batch["src_mask"])
    features, weights = model.decode(state, batch["tgt_in"])  # (B, T, O), (B, T, [N,] S)
    mask = batch["tgt_mask"]  # (B, T)
    logits = model.generator(features[mask])  # (N_tok, V)
    loss_sum, nll_sum = smoothed_nll(logits, batch["tgt_out"][mask], label_smoothing)
    return loss_sum, nll_sum, mask.sum(), weights


def lr_factor(step: int, schedule: str, warmup: int, total: int, floor: float) -> float:
    """The learning rate at `step` as a fraction of the peak: a linear warm-up over `warmup` steps, then

    - `cosine`: half a cosine from 1 down to `floor` at step `total`;
    - `inverse_sqrt`: sqrt(warmup / step) (Vaswani et al., 2017), never below `floor`.
    """
    if step < warmup:
        return (step + 1) / warmup
    if schedule == "inverse_sqrt":
        return max(math.sqrt(max(warmup, 1) / (step + 1)), floor)
    progress = min((step - warmup) / max(total - warmup, 1), 1.0)
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


class TranslationSystem(L.LightningModule):
    """Training, validation and checkpointing of one translation model built from a TrainConfig."""

    def __init__(self, config: dict[str, Any], vocab_size: int) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.cfg: TrainConfig = config_from_dict(config, "hparams")
        self.model = build_model(self.cfg, vocab_size)
        self.tokenizer: Tokenizer | None = None  # set by the caller, restored from checkpoints
        self._val_outputs: list[tuple[int, str]] = []
        self._val_sums = torch.zeros(3)  # nll sum, token count, entropy sum over batches

    def forward(self, batch: dict[str, Tensor]) -> list[str]:
        """Inference: translations of a batch (beam `val_beam`, 1 = greedy), detokenized, in batch order."""
        hyps = translate_batch(self.model, batch, beam=self.cfg.val_beam)
        return [self.tokenizer.decode(ids) for ids in hyps.tokens]

    def _shared_step(self, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        return batch_loss(self.model, batch, self.cfg.label_smoothing)

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        loss_sum, nll_sum, tokens, _ = self._shared_step(batch)
        loss = loss_sum / tokens
        self.log("train/loss", loss, prog_bar=True)
        self.log("train/ppl", torch.exp((nll_sum / tokens).detach().clamp(max=50)))
        self.log("lr", self.lr_schedulers().get_last_lr()[0])
        return loss

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        _, nll_sum, tokens, weights = self._shared_step(batch)
        entropy = attention_entropy(weights, batch["tgt_mask"])
        self._val_sums += torch.stack([nll_sum.float(), tokens.float(), entropy.float()]).cpu()
        # The same search code as evaluate.py, so validation BLEU is the BLEU a user will measure.
        hyps = translate_batch(self.model, batch, beam=self.cfg.val_beam)
        for index, ids in zip(batch["index"].tolist(), hyps.tokens, strict=True):
            self._val_outputs.append((index, self.tokenizer.decode(ids)))

    def on_validation_epoch_start(self) -> None:
        self._val_outputs = []
        self._val_sums = torch.zeros(3)

    def on_validation_epoch_end(self) -> None:
        outputs, sums = self._val_outputs, self._val_sums
        batches = max(self.trainer.num_val_batches[0] if self.trainer.num_val_batches else 1, 1)
        if self.trainer.world_size > 1:  # every rank decoded a disjoint share: gather them all
            gathered: list[Any] = [None] * self.trainer.world_size
            torch.distributed.all_gather_object(gathered, (outputs, sums))
            outputs = [pair for rank_outputs, _ in gathered for pair in rank_outputs]
            sums = sum(rank_sums for _, rank_sums in gathered)
            batches = batches * self.trainer.world_size
        nll_sum, tokens, entropy_sum = sums.tolist()
        references = self.trainer.datamodule.references("val")
        hypotheses = [text for _, text in sorted(outputs)]
        if len(hypotheses) == len(
            references
        ):  # a partial validation (sanity check, limits) has no BLEU
            self.log(
                "val/bleu",
                corpus_bleu(hypotheses, references).value,
                prog_bar=True,
                sync_dist=False,
            )
        self.log("val/loss", nll_sum / max(tokens, 1), sync_dist=False)
        self.log("val/ppl", perplexity(nll_sum, int(tokens)), sync_dist=False)
        self.log("val/attn_entropy", entropy_sum / batches, sync_dist=False)

    def configure_optimizers(self) -> dict[str, Any]:
        optimizer = torch.optim.Adam(self.parameters(), lr=self.cfg.lr, betas=(0.9, 0.98), eps=1e-9)
        total = max(int(self.trainer.estimated_stepping_batches), 1)
        # A short run (tests, --max-steps 60) must not spend itself warming up: cap warm-up at 10%.
        warmup = min(self.cfg.warmup_steps, total // 10)
        schedule = functools.partial(
            lr_factor,
            schedule=self.cfg.lr_schedule,
            warmup=warmup,
            total=total,
            floor=self.cfg.min_lr_ratio,
        )
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }

    def configure_gradient_clipping(
        self, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any
    ) -> None:
        # clip_grad_norm_ returns the norm before clipping: logging it costs no second pass.
        max_norm = self.cfg.clip_norm if self.cfg.clip_norm > 0 else math.inf
        norm = torch.nn.utils.clip_grad_norm_(self.parameters(), max_norm)
        self.log("train/grad_norm", norm)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["seq2seq_version"] = __version__
        checkpoint["tokenizer"] = self.tokenizer.to_bytes()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.tokenizer = Tokenizer.from_bytes(checkpoint["tokenizer"])


def read_checkpoint(path: str | Path, map_location: str = "cpu") -> dict[str, Any]:
    """The raw dict of a checkpoint written by training, checked to be one: else a UserError naming it.

    `weights_only` loading: a checkpoint holds tensors, numbers, strings and bytes only, so a foreign
    pickle is refused instead of run.
    """
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such checkpoint")
    try:
        checkpoint = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:  # torch raises several types for a truncated or non-checkpoint file
        raise UserError(
            f"{path}: not a readable checkpoint (truncated, corrupt or not a checkpoint: "
            f"{type(err).__name__})"
        ) from None
    hparams = checkpoint.get("hyper_parameters") if isinstance(checkpoint, dict) else None
    if (
        not isinstance(hparams, dict)
        or "tokenizer" not in checkpoint
        or "state_dict" not in checkpoint
    ):
        raise UserError(
            f"{path}: not a seq2seq checkpoint (no tokenizer, weights or hyper-parameters inside)"
        )
    if not isinstance(hparams.get("config"), dict) or "vocab_size" not in hparams:
        raise UserError(
            f"{path}: written by another version of seq2seq (hyper-parameters lack config/vocab_size)"
        )
    return checkpoint


def load_system(path: str | Path, map_location: str = "cpu") -> TranslationSystem:
    """Load a checkpoint written by training: model, config and tokenizer, from that file alone.

    A missing, truncated or foreign file is a UserError naming it.
    """
    checkpoint = read_checkpoint(path, map_location)
    hparams = checkpoint["hyper_parameters"]
    try:
        system = TranslationSystem(hparams["config"], hparams["vocab_size"])
        system.load_state_dict(checkpoint["state_dict"])
    except UserError as err:
        raise UserError(f"{path}: {err}") from None
    except (RuntimeError, TypeError, ValueError) as err:
        raise UserError(
            f"{path}: weights do not fit this version of seq2seq ({str(err).splitlines()[0]})"
        ) from None
    try:
        system.on_load_checkpoint(checkpoint)
    except UserError as err:
        raise UserError(f"{path}: {err}") from None
    return system.eval()


def pick_device(name: str) -> torch.device:
    """The device for `--device NAME` (auto: CUDA when there is one); a bad name is a UserError."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UserError(f"--device {name}: not a device (try cpu or cuda)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"--device {name}: no CUDA device here")
    return device
