"""A trained checkpoint's heatmap images, as training's `AttentionHeatmaps` draws them (`seq2seq
plot-attention --tensorboard` is its command line, which logs them into a TensorBoard run).

The pairs are the first `sentences` short pairs of the chosen split, the ones training would pick;
the images are `align/<i>` (teacher-forced on the reference) then `align/<i>/greedy` (the greedy
hypothesis), at the checkpoint's global step, so TensorBoard shows a trained model's alignments
without training it again.
"""

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from datasets import Dataset

from seq2seq.checkpoint import read_checkpoint
from seq2seq.decoding.attention_figure import PairChoice, pairs_of
from seq2seq.decoding.loading import load_model
from seq2seq.training.callbacks import AttentionHeatmaps


@dataclass(frozen=True)
class HeatmapImages:
    """The images and the training step they belong at."""

    step: int  # the checkpoint's global step; 0 for one without (an average)
    images: tuple[tuple[str, np.ndarray], ...]  # (tag, RGB image (H, W, 3) uint8)


def heatmap_images(path: str | Path, choice: PairChoice, sentences: int = 4) -> HeatmapImages:
    """Training's heatmap images of the checkpoint at `path` on the split `choice` names (its
    `index` is checked as for a panel, though the callback picks its own pairs)."""
    checkpoint = read_checkpoint(path)
    pairs = pairs_of(checkpoint, choice)
    model, tokenizer = load_model(path)
    src_ids, tgt_ids = tokenizer.encode_batch(pairs.src), tokenizer.encode_batch(pairs.tgt)
    columns = {"index": list(range(len(pairs))), "src_ids": src_ids, "tgt_ids": tgt_ids}
    columns |= {"src_len": list(map(len, src_ids)), "tgt_len": list(map(len, tgt_ids))}
    heatmaps = AttentionHeatmaps(every_n_steps=1, sentences=sentences)
    heatmaps.set_probes(Dataset.from_dict(columns), tokenizer)  # the pairs training would pick
    images = [image for greedy in (False, True) for image in heatmaps.images(model, greedy)]
    return HeatmapImages(int(checkpoint.get("global_step") or 0), tuple(images))
