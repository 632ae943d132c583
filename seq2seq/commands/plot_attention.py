"""Draw the attention of one sentence of a corpus split, one panel per checkpoint, side by side.

    seq2seq plot-attention CKPT [CKPT ...] [--split val] [--index I] [--beam K] --out FILE

Every checkpoint reads pair I of the split (from 0) of the corpus it was trained on (`--data-dir` or
`--dataset` to use another), teacher-forced on the reference: the model reads the reference
translation and each row is the attention it used to predict that reference subword, the figure
`align/<i>` shows in TensorBoard. With `--beam K` it shows the attention behind the model's own
translation instead. The panels (seq2seq.decoding.attention_figure) are joined left to right in the
order given, so the three scorers are one command: `plot_attention.py additive.ckpt dot.ckpt
scaled.ckpt --out scorers.png`. The image is written whole or not at all.

`--tensorboard DIR` also logs, for each checkpoint, the images training's `AttentionHeatmaps` logs
(`align/<i>` teacher-forced and `align/<i>/greedy`, for the first `--sentences` short pairs of the
split) into the TensorBoard run `DIR/<checkpoint name>`:
`tensorboard --logdir DIR` then shows a trained model's alignments without training it again.

A checkpoint with a foresight head (`seq2seq fit-foresight`) is also read by the head, whose query
has read the word it aligns: its panel goes right of the attention's, titled "foresight", and its
images beside training's, as `align/<i>/foresight` and `align/<i>/greedy/foresight`.
"""

import io
import sys
from pathlib import Path

import numpy as np
from matplotlib.image import imsave

from seq2seq.atomic import atomic_write_bytes
from seq2seq.checkpoint import read_checkpoint
from seq2seq.cli import Parser, cli_message
from seq2seq.decoding.attention_figure import PairChoice, attention_figure, pairs_of
from seq2seq.decoding.flags import refuse_unread
from seq2seq.decoding.loading import load_model
from seq2seq.errors import UserError


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    p = Parser(prog=prog, description=__doc__.split("\n")[0])
    p.add_argument("checkpoints", nargs="+", metavar="CKPT", help="one panel each, left to right")
    p.add_argument("--out", help="the image to write (.png)")
    p.add_argument("--tensorboard", metavar="DIR", help="also log align/<i> images under DIR")
    p.add_argument(
        "--sentences", type=int, default=4, help="--tensorboard's align/<i> images per checkpoint"
    )
    p.add_argument("--split", default="val", help="the corpus split (default: val)")
    p.add_argument("--index", type=int, default=0, help="--out's pair of the split, from 0")
    p.add_argument(
        "--beam", type=int, default=0, help="--out shows the model's own translation, beam K"
    )
    p.add_argument("--dataset", help="another corpus than the checkpoint's, by name")
    p.add_argument("--data-dir", help="another corpus than the checkpoint's, a folder")
    p.add_argument("--src", help="source language (default: the checkpoint's)")
    p.add_argument("--tgt", help="target language (default: the checkpoint's)")
    args = p.parse_args(argv)
    choice = PairChoice(args.split, args.index, args.dataset, args.data_dir, args.src, args.tgt)
    try:
        if args.beam < 0:
            raise UserError(f"--beam {args.beam}: give 0 (teacher-forced) or a beam size")
        if args.out is None and args.tensorboard is None:
            raise UserError("nothing to write: give --out FILE.png, --tensorboard DIR or both")
        if args.tensorboard is None:
            refuse_unread(p, args, ["sentences"], "is for --tensorboard's images: give that too")
        # The TensorBoard images are of their own pairs, teacher-forced and greedy.
        if args.out is None:
            refuse_unread(p, args, ["index", "beam"], "is for the --out image: give that too")
        if args.sentences < 1:
            raise UserError(f"--sentences {args.sentences}: give 1 or more")
        if args.out is not None:
            encode_image(np.zeros((1, 1, 3), np.uint8), Path(args.out))  # the format, before work
        for path in args.checkpoints if args.tensorboard else []:
            run = log_heatmaps(path, choice, args.sentences, Path(args.tensorboard))
            print(f"{run}: align/<i> images of {path}")
        if args.out is None:
            return 0
        figure = attention_figure(args.checkpoints, choice, args.beam)
        out = write_image(Path(args.out), figure.image)
    except UserError as err:
        print(f"error: {cli_message(err)}", file=sys.stderr)
        return 2
    print(f"{out}: {len(figure.panels)} panel(s), pair {args.index} of {args.split}")
    return 0


def log_heatmaps(path: str, choice: PairChoice, sentences: int, logdir: Path) -> Path:
    """Training's heatmap images of the checkpoint (`AttentionHeatmaps`, on the first `sentences`
    short pairs of `choice.split`, the ones training would pick), logged at its global step into
    the run `logdir/<its name>`; returns the run's folder."""
    from datasets import Dataset
    from torch.utils.tensorboard import SummaryWriter

    from seq2seq.alignment.foresight import head_of
    from seq2seq.training.callbacks import AttentionHeatmaps

    checkpoint = read_checkpoint(path)
    pairs = pairs_of(checkpoint, choice)
    model, tokenizer = load_model(path)
    src_ids, tgt_ids = tokenizer.encode_batch(pairs.src), tokenizer.encode_batch(pairs.tgt)
    columns = {"index": list(range(len(pairs))), "src_ids": src_ids, "tgt_ids": tgt_ids}
    columns |= {"src_len": list(map(len, src_ids)), "tgt_len": list(map(len, tgt_ids))}
    heatmaps = AttentionHeatmaps(every_n_steps=1, sentences=sentences)
    heatmaps.set_probes(Dataset.from_dict(columns), tokenizer)  # the pairs training would pick
    step = int(checkpoint.get("global_step") or 0)  # an averaged checkpoint has none: 0
    head = head_of(checkpoint)  # the foresight head's reading goes beside the attention
    run = logdir / Path(path).stem
    with SummaryWriter(run) as writer:
        for greedy in (False, True):
            for tag, image in heatmaps.images(model, greedy, head):
                writer.add_image(tag, image, step, dataformats="HWC")
    return run


def encode_image(image: np.ndarray, out: Path) -> bytes:
    """The image (H, W, 3) in the format `out`'s suffix names (PNG without one); a format
    matplotlib cannot write is a UserError naming --out."""
    encoded = io.BytesIO()
    try:
        imsave(encoded, image, format=out.suffix.removeprefix(".") or "png")
    except (ValueError, KeyError, OSError):
        raise UserError(f"--out {out}: cannot write {out.suffix} images (give a .png)") from None
    return encoded.getvalue()


def write_image(out: Path, image: np.ndarray) -> Path:
    """The image published as `out`, whole or not at all."""
    try:
        return atomic_write_bytes(out, encode_image(image, out))
    except OSError as err:
        raise UserError(f"--out {out}: cannot write ({err.strerror})") from None
