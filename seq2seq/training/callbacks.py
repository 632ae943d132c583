"""Callbacks: non-essential measurements that training runs with or without.

Dimension letters: B batch (for the heatmaps, the probe sentences), S source length, T target
length, N heads.
"""

import copy
import time
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor, nn

from seq2seq.alignment.plotting import AlignmentPlot
from seq2seq.data.batching import collate
from seq2seq.data.tokenizer import EOS, Tokenizer
from seq2seq.decoding.search import greedy_search
from seq2seq.errors import UserError
from seq2seq.models.foresight import ForesightHead, foresight_weights, translator_states
from seq2seq.models.interface import Seq2Seq

PROBE_MAX_LEN = 30  # subwords; longer probes make unreadable tick labels


class TokensPerSecond(L.Callback):
    """Logs `train/tokens_per_sec`: real target tokens per second of the whole job (all ranks), over
    each logging window.

    Each rank adds its token counts up on its device, without a host sync per step. Every
    `log_every_n_steps` updates, one all-reduce sums the window's counts over the ranks (every rank
    reaches it after the same update, so none waits in a collective alone) and one read brings the
    sum to the host; it is divided by the wall-clock time of the window, which DDP's gradient
    all-reduce keeps the same on every rank.
    """

    def __init__(self) -> None:
        self._tokens: Tensor | None = None  # () long on the device; None: no window open
        self._start = 0.0
        self._step = 0  # global_step at the last batch end: an update happened when it changes

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._step = trainer.global_step  # a resumed run starts at its checkpoint's step

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
        # Log after an update only, not after each of the batches it accumulates.
        stepped, self._step = trainer.global_step != self._step, trainer.global_step
        if not stepped or trainer.global_step % trainer.log_every_n_steps:
            return
        tokens = self._tokens
        if trainer.world_size > 1:
            torch.distributed.all_reduce(tokens)
        count = int(tokens)  # the one host sync of the window, before the clock is read
        elapsed = time.perf_counter() - self._start
        pl_module.log("train/tokens_per_sec", count / max(elapsed, 1e-9))
        self._tokens = None  # the next window opens at the next batch

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._tokens = None  # validation time is not training time: start a new window after it


def cpu_copy(model: nn.Module) -> nn.Module:
    """An eval-mode fp32 copy of `model` on the CPU that allocates nothing on the model's device.

    Parameters and buffers are moved one by one through deepcopy's memo, so a GPU model is never
    duplicated on the GPU, tied weights stay tied, and a CPU fp32 model is shared, not copied.
    """
    memo: dict[int, Any] = {}
    for tensor in [*model.parameters(), *model.buffers()]:
        dtype = torch.float32 if tensor.is_floating_point() else tensor.dtype
        cpu = tensor.detach().to("cpu", dtype)  # the one device-to-host copy (none on CPU)
        memo[id(tensor)] = nn.Parameter(cpu, False) if isinstance(tensor, nn.Parameter) else cpu
    return copy.deepcopy(model, memo).eval()


def teacher_forced_alignments(model: Seq2Seq, batch: dict[str, Tensor]) -> Tensor:
    """Attention of `model` reading the reference: (B, T, [N,] S), zero on source padding.

    Row t is the attention used to predict tgt_out[t]; rows at real target positions sum to one.
    """
    state = model.encode(batch["src"], batch["src_lens"], batch["src_mask"])
    _, weights = model.decode(state, batch["tgt_in"])  # (B, T, [N,] S)
    return weights.float()


def probe_alignments(
    model: Seq2Seq, batch: dict[str, Tensor], greedy: bool
) -> list[tuple[Tensor, list[int]]]:
    """Per sentence, the attention cut to its real lengths, (T_b, [N,] S_b), and the target ids
    (EOS included) its rows belong to: the reference's, or with `greedy` the model's own output."""
    if greedy:
        hyps = greedy_search(model, batch["src"], batch["src_lens"], batch["src_mask"])
        return [(w, ids + [EOS]) for w, ids in zip(hyps.weights, hyps.tokens, strict=True)]
    weights = teacher_forced_alignments(model, batch)  # (B, T, [N,] S)
    tgt_lens, src_lens = batch["tgt_mask"].sum(1).tolist(), batch["src_lens"].tolist()
    targets = batch["tgt_out"].tolist()  # (B, T)
    return [
        (weights[b, :t, ..., :s], targets[b][:t])  # (T_b, [N,] S_b)
        for b, (t, s) in enumerate(zip(tgt_lens, src_lens, strict=True))
    ]


def probe_foresight(
    model: Seq2Seq, head: ForesightHead, probes: dict[str, Tensor], read: list[list[int]]
) -> list[tuple[Tensor, list[int]]]:
    """The foresight head's reading of each probe's target ids `read[b]` (EOS last: the reference's
    or the model's own, as `probe_alignments` gives them), teacher-forced: (T_b, S_b) per sentence."""
    src_lens = probes["src_lens"].tolist()
    items = [
        {"src_ids": probes["src"][b, : s - 1].tolist(), "tgt_ids": ids[:-1], "index": b}
        for b, (s, ids) in enumerate(zip(src_lens, read, strict=True))
    ]  # ids without EOS: collate adds it
    batch = collate(items)  # sorted by target length: `index` names each row's probe
    weights, _ = foresight_weights(head, translator_states(model, batch))  # (B, T, S)
    rows = {int(b): r for r, b in enumerate(batch["index"].tolist())}
    return [
        (weights[rows[b], : len(ids), :s], ids)  # (T_b, S_b)
        for b, (s, ids) in enumerate(zip(src_lens, read, strict=True))
    ]


class AttentionHeatmaps(L.Callback):
    """Logs attention heatmaps of K fixed validation sentences to TensorBoard (images `align/<i>`).

        At the start of training and every `every_n_steps` updates: the teacher-forced attention against
        the reference (same axes each time, so TensorBoard's step slider animates one picture). At each
        validation end: the attention of the greedy hypothesis, under `align/<i>/greedy`. Given a foresight
    head (`images(..., foresight=head)`, as `seq2seq plot-attention --tensorboard` gives a checkpoint's),
    its reading of the same targets goes beside each, under `align/<i>/foresight` and
    `align/<i>/greedy/foresight`. The work runs on
        rank 0, on a CPU copy of the model in eval mode under no_grad, with the CPU RNG forked: the
        training model, its mode and the training RNG stream are left as they were.
    """

    def __init__(self, every_n_steps: int, sentences: int = 4) -> None:
        if every_n_steps < 1 or sentences < 1:
            raise ValueError(
                f"every_n_steps and sentences must be positive, got {every_n_steps}, {sentences}"
            )
        self.every_n_steps, self.sentences = every_n_steps, sentences
        self.probes: dict[str, Tensor] | None = None  # the K sentences as one CPU batch
        self.tokenizer: Tokenizer | None = None
        self.head: int | None = None  # the head the model's alignments read (None: the mean)
        # Per (probe, kind): the target ids of its last figure and the figure, redrawn when they match.
        self._plots: dict[tuple[int, str], tuple[list[int], AlignmentPlot]] = {}
        self._last_step = -1

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        dm = trainer.datamodule
        if dm is None or "val" not in getattr(dm, "datasets", {}):
            rank_zero_warn("AttentionHeatmaps needs a TranslationDataModule with a val split; off")
            return
        self.set_probes(dm.datasets["val"], getattr(pl_module, "tokenizer", None) or dm.tokenizer)

    def set_probes(self, val: Any, tokenizer: Tokenizer) -> None:
        """Pick the first K pairs of `val` (a tokenized split) short enough to read, else the shortest."""
        lengths = np.maximum(np.asarray(val["src_len"][:]), np.asarray(val["tgt_len"][:]))
        short = np.flatnonzero(lengths <= PROBE_MAX_LEN)[: self.sentences]
        rows = short if len(short) == self.sentences else np.argsort(lengths, kind="stable")
        items = [val[int(i)] for i in rows[: self.sentences]]
        batch = collate([{k: x[k] for k in ("src_ids", "tgt_ids", "index")} for x in items])
        order = batch["index"].argsort()  # collate leads with the longest target; tags follow val
        self.probes = {name: value[order] for name, value in batch.items()}
        self.tokenizer, self._plots = tokenizer, {}

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._log_teacher_forced(trainer, pl_module)  # the untrained blur the slider starts from

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        if trainer.global_step % self.every_n_steps == 0:
            self._log_teacher_forced(trainer, pl_module)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._log(trainer, pl_module, greedy=True)

    def _log_teacher_forced(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # With gradient accumulation several batches end on the same update: log it once.
        if trainer.global_step != self._last_step:
            self._last_step = trainer.global_step
            self._log(trainer, pl_module, greedy=False)

    def _log(self, trainer: L.Trainer, pl_module: L.LightningModule, greedy: bool) -> None:
        if not trainer.is_global_zero or self.probes is None:
            return
        writer = next(
            (lg.experiment for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)), None
        )
        if writer is None:
            return
        for tag, image in self.images(pl_module.model, greedy):
            writer.add_image(tag, image, trainer.global_step, dataformats="HWC")

    def images(
        self, model: Seq2Seq, greedy: bool, foresight: ForesightHead | None = None
    ) -> list[tuple[str, np.ndarray]]:
        """The K heatmaps as (tag, RGB image (H, W, 3)), computed on a CPU copy of `model`; with a
        `foresight` head (on the CPU), the K of its reading after them."""
        threads = torch.get_num_threads()
        # A K-sentence batch is too small to share: thread hand-offs cost more than they save
        # (docs/results/benchmarks.md#figures-once-kept-in-the-data-and-training-code).
        # fork_rng: nothing here draws random numbers, and this guarantees the CPU stream.
        torch.set_num_threads(1)
        try:
            with torch.random.fork_rng(devices=[]), torch.no_grad():
                copy = cpu_copy(model)
                matrices = probe_alignments(copy, self.probes, greedy)
                read = [ids for _, ids in matrices]
                foreseen = [] if foresight is None else probe_foresight(
                    copy, foresight, self.probes, read
                )  # fmt: skip
            self.head = model.alignment_head  # the last panel: the head alignments read
        finally:
            torch.set_num_threads(threads)
        title, suffix = ("greedy hypothesis", "/greedy") if greedy else ("teacher-forced", "")
        return [
            (f"align/{i}{suffix}", self._render(i, weights, tgt_ids, title))
            for i, (weights, tgt_ids) in enumerate(matrices)
        ] + [
            (
                f"align/{i}{suffix}/foresight",
                self._render(i, weights, tgt_ids, f"{title}, foresight"),
            )
            for i, (weights, tgt_ids) in enumerate(foreseen)
        ]

    def _render(self, i: int, weights: Tensor, tgt_ids: list[int], title: str) -> np.ndarray:
        """Redraw only the heatmap when probe i's tokens are those of the last image of its kind
        (always for the reference, often for a converged hypothesis); else draw a new figure."""
        key = (i, title)
        if key in self._plots and self._plots[key][0] == tgt_ids:
            self._plots[key][1].update(weights)
        else:
            src_ids = self.probes["src"][i, : int(self.probes["src_lens"][i])].tolist()
            src, tgt = self.tokenizer.pieces(src_ids), self.tokenizer.pieces(tgt_ids)
            self._plots[key] = (tgt_ids, AlignmentPlot(weights, src, tgt, title, self.head))
        return self._plots[key][1].render()


class AlignmentErrorRate(L.Callback):
    """Logs `val/aer`, `val/align_precision` and `val/align_recall`: the model's word alignments of
    the validation set, teacher-forced on its references, against a gold file beside it.

    The gold file is `<val split>.align` (or `.align.gz`) in the corpus folder, next to `val.de` and
    `val.en`: one Pharaoh line per pair, `i-j` sure and `ipj` possible links (seq2seq.alignment.words).
    Without one, or for a hub corpus, the callback does nothing and says nothing. It runs at each
    validation end (not the sanity check), on rank 0, with the training model in eval mode under
    no_grad; alignments are those of `Translator.align` (mean over heads, EOS dropped).

    Args:
        direction: "tgt2src" (each target word to its best source word), "src2tgt" or "intersect".
        batch_tokens: padded tokens per teacher-forced batch.
    """

    def __init__(self, direction: str = "tgt2src", batch_tokens: int = 4096) -> None:
        self.direction, self.batch_tokens = direction, batch_tokens
        self.pairs: tuple[list[str], list[str]] | None = None  # val sources, references
        self.gold: list | None = None  # per pair, (sure, possible) link sets

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        from seq2seq.alignment.words import read_pharaoh
        from seq2seq.data.corpus import read_pairs, resolve_corpus
        from seq2seq.data.words import check_links_fit

        dm = trainer.datamodule
        if not trainer.is_global_zero or "val" not in getattr(dm, "split_names", {}):
            return
        source = resolve_corpus(dm.cfg.dataset, dm.cfg.data_dir)
        split = dm.split_names["val"]
        names = (f"{split}.align", f"{split}.align.gz")
        found = [source.folder / name for name in names] if source.folder is not None else []
        path = next((p for p in found if p.is_file()), None)
        if path is None:
            return
        pairs, gold = read_pairs(source, split, dm.cfg.src, dm.cfg.tgt), read_pharaoh(path)
        if pairs.empty or len(gold) != len(pairs):  # blank pairs were dropped: lines would shift
            rank_zero_warn(
                f"{path} has {len(gold)} lines for {len(pairs) + pairs.empty} validation pairs "
                f"({pairs.empty} blank); val/aer is off"
            )
            return
        try:
            check_links_fit([p for _, p in gold], pairs.src, pairs.tgt, str(path))
        except UserError as err:
            rank_zero_warn(f"{err}; val/aer is off")
            return
        self.pairs, self.gold = (pairs.src, pairs.tgt), gold

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.gold is None or trainer.sanity_checking or not trainer.is_global_zero:
            return
        score = self.score(pl_module.model, pl_module.tokenizer)
        for name, value in (("aer", score.aer), ("align_precision", score.precision),
                            ("align_recall", score.recall)):  # fmt: skip
            pl_module.log(f"val/{name}", value, rank_zero_only=True)

    def score(self, model: Seq2Seq, tokenizer: Tokenizer) -> "AERScore":  # noqa: F821
        """AER, precision and recall of `model` on the validation pairs; its mode is kept."""
        from seq2seq.alignment.words import alignment_error_rate
        from seq2seq.decoding.translator import Translator

        training = model.training
        try:
            device = next(model.parameters()).device
            translator = Translator(model, tokenizer, device)  # eval mode; no copy
            found = translator.align(*self.pairs, self.batch_tokens, direction=self.direction)
        finally:
            model.train(training)
        return alignment_error_rate([result.word_alignment for result in found], self.gold)
