"""TranslationSystem: the LightningModule that trains a translation model it is handed.

The model is a plain `nn.Module` (seq2seq.models.build); this class adds what training needs: the
label-smoothed loss (seq2seq.training.losses) per real target token of each update, however its tokens are
split over accumulated batches and ranks (`on_before_optimizer_step`); validation loss,
perplexity and BLEU from the same search code that evaluation uses; Adam with warm-up and cosine
or inverse-sqrt decay, gradient clipping, and a checkpoint that carries the model's arguments and
its tokenizer (seq2seq.checkpoint). Batches with word-alignment links (`align_ref`) add the guided-
alignment loss (seq2seq.data.links), normalised the same way.
"""

import dataclasses
import functools
import math
from typing import Any

import lightning as L
import torch
from torch import Tensor

from seq2seq import __version__
from seq2seq.alignment.stats import means, recorded_scores, row_sums, stacked_scores
from seq2seq.data.tokenizer import EOS, UNK, Tokenizer
from seq2seq.decoding.metrics import corpus_bleu, perplexity
from seq2seq.decoding.search import SearchConfig, translate_batch
from seq2seq.models.interface import Seq2Seq
from seq2seq.models.kernels import accelerate
from seq2seq.training.config import DEFAULT_WARMUP, OptimConfig, ValidationConfig
from seq2seq.training.losses import alignment_loss, batch_loss


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


def warmup_steps(given: int | None, total: int) -> int:
    """The warm-up of a run of `total` updates: `--warmup-steps` when given (Wu et al. 2021 warm up
    over 2,000 of about 8,000), else `DEFAULT_WARMUP` cut to a tenth of the run, so that a short run
    (a test's 60 updates) does not spend itself warming up."""
    return given if given is not None else min(DEFAULT_WARMUP, total // 10)


def word_dropout(batch: dict[str, Tensor], p: float) -> dict[str, Tensor]:
    """The batch with each real subword of `src` and `tgt_in` replaced by UNK with probability `p`.

    Word dropout (Sennrich et al. 2016, "Edinburgh Neural Machine Translation Systems for WMT 16"; Gal
    and Ghahramani 2016): the model learns not to lean on any one input word. Padding, BOS and EOS stay,
    and so do the targets the loss reads (`tgt_out`). The draws come from torch's generator, which
    `--seed` fixes.
    """
    out = dict(batch)
    for key in ("src", "tgt_in"):
        ids = batch[key]  # (B, L)
        drop = (ids > EOS) & (torch.rand(ids.shape, device=ids.device) < p)  # (B, L)
        out[key] = ids.masked_fill(drop, UNK)
    return out


def adam(params: Any, lr: float) -> torch.optim.Adam:
    """Training's optimizer: Adam with betas (0.9, 0.98) and eps 1e-9, as one fused kernel per
    parameter: the default kernels pass over every parameter a dozen times (measured:
    docs/results/benchmarks.md#rows-that-end-the-losss-weight-gradient-adam-and-dropout-on-an-avx2-cpu).
    A run resumed from a checkpoint keeps the kernel it was saved with (the group's `fused` flag).
    """
    return torch.optim.Adam(params, lr=lr, betas=(0.9, 0.98), eps=1e-9, fused=True)


class TranslationSystem(L.LightningModule):
    """Training, validation and checkpointing of one translation model.

    Args:
        model: the model to train (from `seq2seq.models.build.build_model`, so it has `model_args`).
        tokenizer: its tokenizer; decodes validation hypotheses and travels in every checkpoint.
        optim: Adam's peak rate and its schedule (`lr_factor`), label smoothing, gradient clipping,
            word dropout (`word_dropout`) and the weight and cost of the guided-alignment loss of
            batches that carry links (seq2seq.data.links); default: `OptimConfig()`.
        validation: its `val_beam` and `val_length_penalty` are validation BLEU's search (default:
            greedy).
        corpus: what the model trains on (dataset, data_dir, src, tgt), kept in checkpoints so that
            `evaluate.py --split` finds the same corpus.
        compile: run the GRU decoder's loops compiled (seq2seq.models.kernels.compiled).

    A checkpoint's `hyper_parameters` hold these settings as plain values.
    """

    def __init__(
        self,
        model: Seq2Seq,
        tokenizer: Tokenizer,
        optim: OptimConfig | None = None,
        validation: ValidationConfig | None = None,
        corpus: dict[str, Any] | None = None,
        compile: bool = False,
    ) -> None:
        super().__init__()
        self.optim = optim if optim is not None else OptimConfig()
        validation = validation if validation is not None else ValidationConfig()
        plain = {**dataclasses.asdict(self.optim), **dataclasses.asdict(validation)}
        self.save_hyperparameters({**plain, "corpus": corpus, "compile": compile})
        self.model, self.tokenizer = model, tokenizer
        # The model's kernels plugged in, in place (seq2seq.models.kernels); with `compile`, its
        # decoder loops compiled for the loss and validation search too. A plain object, not a
        # submodule: the weights, the checkpoint and the heatmaps' CPU copy stay the model's.
        runner = accelerate(model, compile=compile)
        self.compiled = runner if compile else None
        self.val_search = SearchConfig(
            beam=validation.val_beam, length_penalty=validation.val_length_penalty
        )
        self._val_outputs: list[tuple[int, str]] = []
        self._val_sums = torch.zeros(6, dtype=torch.float64)  # nll, tokens, then `row_sums`
        self._val_scored = True
        # (4,) loss sum, NLL sum, tokens and guided-alignment loss sum of this update
        self._update_sums: Tensor | None = None
        self._lr_horizon: int | None = None  # the schedule's last step, kept in checkpoints

    def forward(self, batch: dict[str, Tensor]) -> list[str]:
        """Inference: translations of a batch (beam `val_beam`), detokenized, in batch order."""
        hyps = translate_batch(self.compiled or self.model, batch, self.val_search)
        return [self.tokenizer.decode(ids) for ids in hyps.tokens]

    def _shared_step(self, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        return batch_loss(self.compiled or self.model, batch, self.optim.label_smoothing)

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        """The batch's loss SUM (plus weight x the guided-alignment sum when the batch has links);
        `on_before_optimizer_step` divides the update by its tokens."""
        if self.optim.word_dropout > 0:
            batch = word_dropout(batch, self.optim.word_dropout)
        loss_sum, nll_sum, tokens, weights = self._shared_step(batch)
        align_sum = loss_sum.new_zeros(())
        if "align_ref" in batch:  # the attention guided alignment trains: seq2seq.data.links
            aligned = self.model.alignment_view(weights)  # (B, T, S)
            align_sum = alignment_loss(
                aligned, batch["align_ref"], self.optim.guided_alignment_cost
            )
        sums = torch.stack(
            [loss_sum.detach(), nll_sum.detach(), tokens.to(loss_sum.dtype), align_sum.detach()]
        )
        # On the device, added up without a host sync; read once per update.
        self._update_sums = sums if self._update_sums is None else self._update_sums + sums  # (4,)
        self.log("lr", self.lr_schedulers().get_last_lr()[0])
        return loss_sum + self.optim.guided_alignment_weight * align_sum

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Make the gradient d(loss sum)/d(theta) / (real target tokens of the whole update).

        Lightning divided each micro-batch's returned loss sum by `accumulate_grad_batches` (A) and
        DDP averaged the gradients over the W ranks, so the gradient here is the sum over every
        micro-batch of every rank, divided by A * W. One all-reduce of (loss sum, NLL sum, tokens)
        gives the update's token count; scaling the gradients by A * W / tokens leaves the gradient
        of the mean loss per real target token, however the tokens were split into micro-batches and
        ranks (a batch of few tokens weighs what its tokens weigh, no more). It holds for an epoch's
        last, shorter window too: Lightning divides by A there as well. The same all-reduce makes
        `train/loss` and `train/ppl` those of the whole update on every rank. This hook runs after
        the callbacks' (a finite positive factor changes no non-finite verdict) and before
        `configure_gradient_clipping`, which so clips and logs the final gradient. Under fp16 the
        grad scaler sees sums, not means, so early on it halves its scale (skipping one step per
        halving) until it is smaller by about a batch's token count.
        """
        sums, self._update_sums = self._update_sums, None
        if sums is None:
            return
        if self.trainer.world_size > 1:  # asynchronous on an accelerator: no host sync either
            torch.distributed.all_reduce(sums)
        loss_sum, nll_sum, tokens, align_sum = sums.unbind()  # tokens >= 1: each target has EOS
        factor = self.trainer.accumulate_grad_batches * self.trainer.world_size / tokens
        grads = [p.grad for p in self.parameters() if p.grad is not None]
        if grads:
            torch._foreach_mul_(grads, factor)  # one fused kernel per device and dtype
        # train/loss is what val/loss is, the NLL per target token; the label-smoothed loss that
        # the gradient follows is logged beside it.
        self.log("train/loss", nll_sum / tokens, prog_bar=True)
        self.log("train/smoothed_loss", loss_sum / tokens)
        self.log("train/ppl", torch.exp((nll_sum / tokens).clamp(max=50)))
        if self.optim.guided_alignment_weight > 0:  # per real target token, before the weight
            self.log("train/align_loss", align_sum / tokens)

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        with recorded_scores(self.model) as recorded:  # raw scores e_tj, for val/score_std
            _, nll_sum, tokens, weights = self._shared_step(batch)
        scores = stacked_scores(recorded, batch["tgt_mask"].size(1))  # (B, T, S) or None
        self._val_scored = self._val_scored and scores is not None
        # Sums over target rows, divided by the rows of all ranks at the end: means per row that
        # neither the batching nor the number of processes changes.
        rows = row_sums(weights, batch["tgt_mask"], batch["src_mask"], scores)  # (4,)
        self._val_sums += torch.cat(
            [torch.stack([nll_sum.double(), tokens.double()]).detach().cpu(), rows]
        )
        # The same search code as evaluate.py, so validation BLEU is the BLEU a user will measure.
        hyps = translate_batch(self.compiled or self.model, batch, self.val_search)
        for index, ids in zip(batch["index"].tolist(), hyps.tokens, strict=True):
            self._val_outputs.append((index, self.tokenizer.decode(ids)))

    def on_train_start(self) -> None:
        self._update_sums = None  # nothing left over from an interrupted window of an earlier fit

    def on_validation_epoch_start(self) -> None:
        self._val_outputs = []
        self._val_sums = torch.zeros(6, dtype=torch.float64)  # nll, tokens, then `row_sums`
        self._val_scored = True  # every batch recorded its raw scores

    def on_validation_epoch_end(self) -> None:
        outputs, sums = self._val_outputs, self._val_sums
        if self.trainer.world_size > 1:  # every rank decoded a disjoint share: gather them all
            gathered: list[Any] = [None] * self.trainer.world_size
            torch.distributed.all_gather_object(gathered, (outputs, sums))
            outputs = [pair for rank_outputs, _ in gathered for pair in rank_outputs]
            sums = sum(rank_sums for _, rank_sums in gathered)
        nll_sum, tokens = sums[:2].tolist()
        data = self.trainer.datamodule
        references = data.references("val")
        left_out = data.counts.get("val/too_long", 0)  # over the model's positions
        if len(outputs) == len(references) - left_out:  # a partial validation (limits): no BLEU
            hypotheses = [text for _, text in sorted(outputs)]
            kept = [references[index] for index, _ in sorted(outputs)]
            self.log("val/bleu", corpus_bleu(hypotheses, kept).value, prog_bar=True)
        # Every rank holds the gathered sums, so every rank logs the same value: no sync needed.
        self.log("val/loss", nll_sum / max(tokens, 1))
        self.log("val/ppl", perplexity(nll_sum, int(tokens)))
        # How sharp attention is, and why (seq2seq.alignment.stats): TensorBoard shows a scorer's
        # attention sharpening, or not, over training.
        stats = means(sums[2:], with_scores=self._val_scored)
        self.log("val/attn_entropy", stats["attn_entropy"])
        self.log("val/max_weight", stats["max_weight"])
        if stats["score_std"] is not None:
            self.log("val/score_std", stats["score_std"])

    def configure_optimizers(self) -> dict[str, Any]:
        hp = self.optim
        optimizer = adam(self.parameters(), hp.lr)
        # A resumed run keeps the horizon it started with (on_load_checkpoint runs first): a new
        # --max-steps or --max-epochs moves where training stops, never the rate it is at.
        total = self._lr_horizon or max(int(self.trainer.estimated_stepping_batches), 1)
        self._lr_horizon = total
        warmup = warmup_steps(hp.warmup_steps, total)
        schedule = functools.partial(
            lr_factor, schedule=hp.lr_schedule, warmup=warmup, total=total, floor=hp.min_lr_ratio
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
        max_norm = self.optim.clip_norm if self.optim.clip_norm > 0 else math.inf
        norm = torch.nn.utils.clip_grad_norm_(self.parameters(), max_norm)
        self.log("train/grad_norm", norm)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self._lr_horizon = checkpoint.get("lr_horizon")  # None in checkpoints written before it
        # Dropout and word dropout draw from torch's generator: a resumed run goes on with the draws
        # the stopped one would have made next (checkpoints before 0.3.0 kept no generator state).
        if "rng_state" in checkpoint:
            torch.set_rng_state(checkpoint["rng_state"])
        # On a GPU dropout draws from the device's generator (older checkpoints kept none).
        if "cuda_rng_state" in checkpoint and torch.cuda.is_available():
            torch.cuda.set_rng_state(checkpoint["cuda_rng_state"])

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["lr_horizon"] = self._lr_horizon
        checkpoint["rng_state"] = torch.get_rng_state()  # (5056,) uint8: the CPU generator's
        # The current device's (under DDP each rank's own), once CUDA is in use: asking earlier
        # would start CUDA in a run that never uses it.
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            checkpoint["cuda_rng_state"] = torch.cuda.get_rng_state()  # (16,) uint8
        # What `--precision auto` became, which a resumed run keeps (seq2seq.training.launch).
        checkpoint["precision"] = str(self.trainer.precision)
        # What rebuilds the model without this class (seq2seq.decoding.loading.load_model).
        checkpoint["seq2seq_version"] = __version__
        checkpoint["model_args"] = dict(self.model.model_args)
        checkpoint["tokenizer"] = self.tokenizer.to_bytes()
