"""Draw the attention of one sentence of a corpus split, one panel per checkpoint, side by side.

    seq2seq plot-attention CKPT [CKPT ...] [--split val] [--index I] [--beam K] --out FILE

Every checkpoint reads pair I of the split (from 0) of the corpus it was trained on (`--data-dir` or
`--dataset` to use another), teacher-forced on the reference: the model reads the reference
translation and each row is the attention it used to predict that reference subword, the figure
`align/<i>` shows in TensorBoard. With `--beam K` it shows the attention behind the model's own
translation instead. Each panel is `seq2seq.alignment.plotting.AlignmentPlot`, titled with the checkpoint's
model and scorer; the panels are joined left to right in the order given, so the three scorers are
one command: `plot_attention.py additive.ckpt dot.ckpt scaled.ckpt --out scorers.png`.

`--tensorboard DIR` also logs, for each checkpoint, the images training's `AttentionHeatmaps` logs
(`align/<i>` teacher-forced and `align/<i>/greedy`, for the first `--sentences` short pairs of the
split) into the TensorBoard run `DIR/<checkpoint name>`: `tensorboard --logdir DIR` then shows a
trained model's alignments without training it again.
"""

import argparse
import sys
from pathlib import Path

from matplotlib.image import imsave

from seq2seq.alignment.plotting import AlignmentPlot, side_by_side
from seq2seq.checkpoint import corpus_of, read_checkpoint
from seq2seq.cli import Parser, cli_message
from seq2seq.data.corpus import Pairs, read_pairs, resolve_corpus
from seq2seq.decoding.loading import load_model
from seq2seq.decoding.translator import Translation, Translator
from seq2seq.errors import UserError


def model_name(model_args: dict) -> str:
    """`rnn additive`, `rnn dot`, ... or `transformer`: what a panel's title calls the model."""
    kind = model_args.get("model", "rnn")
    return f"{kind} {model_args['score']}" if "score" in model_args else kind


def pairs_of(checkpoint: dict, args: argparse.Namespace) -> Pairs:
    """The pairs of `args.split` of the checkpoint's corpus (or the one `args` names)."""
    corpus = corpus_of(checkpoint) or {}
    if args.dataset or args.data_dir:  # a corpus given here replaces the checkpoint's entirely
        dataset, data_dir = args.dataset, args.data_dir
    else:
        dataset, data_dir = corpus.get("dataset"), corpus.get("data_dir")
    src, tgt = args.src or corpus.get("src") or "de", args.tgt or corpus.get("tgt") or "en"
    source = resolve_corpus(dataset or "multi30k", data_dir)
    pairs = read_pairs(source, args.split, src, tgt)
    if not 0 <= args.index < len(pairs):
        raise UserError(
            f"--index {args.index}: split {args.split!r} of {source.location} has {len(pairs):,} "
            f"pairs, numbered 0 to {len(pairs) - 1:,}"
        )
    return pairs


def attention_of(path: str, args: argparse.Namespace) -> tuple[Translation, str]:
    """The checkpoint's attention on pair `args.index` of `args.split`, and the panel's title."""
    checkpoint = read_checkpoint(path)
    pairs = pairs_of(checkpoint, args)
    sentence, reference = pairs.src[args.index], pairs.tgt[args.index]
    translator = Translator.load(path)
    if args.beam:
        [result] = translator.translate([sentence], beam=args.beam)
        how = f"beam {args.beam}"
    else:
        [result] = translator.align([sentence], [reference])
        how = "teacher-forced"
    title = f"{model_name(checkpoint['model_args'])}, {how}: {Path(path).name}"
    return result, title


def log_heatmaps(path: str, args: argparse.Namespace) -> Path:
    """Training's heatmap images of the checkpoint, logged into the run `args.tensorboard/<name>`."""
    from datasets import Dataset
    from torch.utils.tensorboard import SummaryWriter

    from seq2seq.training.callbacks import AttentionHeatmaps

    checkpoint = read_checkpoint(path)
    pairs = pairs_of(checkpoint, args)
    model, tokenizer = load_model(path)
    src_ids, tgt_ids = tokenizer.encode_batch(pairs.src), tokenizer.encode_batch(pairs.tgt)
    columns = {"index": list(range(len(pairs))), "src_ids": src_ids, "tgt_ids": tgt_ids}
    columns |= {"src_len": list(map(len, src_ids)), "tgt_len": list(map(len, tgt_ids))}
    heatmaps = AttentionHeatmaps(every_n_steps=1, sentences=args.sentences)
    heatmaps.set_probes(Dataset.from_dict(columns), tokenizer)  # the pairs training would pick
    step = int(checkpoint.get("global_step") or 0)  # an averaged checkpoint has none: 0
    run = Path(args.tensorboard) / Path(path).stem
    with SummaryWriter(run) as writer:
        for greedy in (False, True):
            for tag, image in heatmaps.images(model, greedy):
                writer.add_image(tag, image, step, dataformats="HWC")
    return run


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    p = Parser(prog=prog, description=__doc__.split("\n")[0])
    p.add_argument("checkpoints", nargs="+", metavar="CKPT", help="one panel each, left to right")
    p.add_argument("--out", help="the image to write (.png)")
    p.add_argument("--tensorboard", metavar="DIR", help="also log align/<i> images under DIR")
    p.add_argument("--sentences", type=int, default=4, help="align/<i> images per checkpoint")
    p.add_argument("--split", default="val", help="the corpus split (default: val)")
    p.add_argument("--index", type=int, default=0, help="the pair of the split, from 0")
    p.add_argument("--beam", type=int, default=0, help="the model's own translation, beam K")
    p.add_argument("--dataset", help="another corpus than the checkpoint's, by name")
    p.add_argument("--data-dir", help="another corpus than the checkpoint's, a folder")
    p.add_argument("--src", help="source language (default: the checkpoint's)")
    p.add_argument("--tgt", help="target language (default: the checkpoint's)")
    args = p.parse_args(argv)
    try:
        if args.beam < 0:
            raise UserError(f"--beam {args.beam}: give 0 (teacher-forced) or a beam size")
        if args.out is None and args.tensorboard is None:
            raise UserError("nothing to write: give --out FILE.png, --tensorboard DIR or both")
        if args.sentences < 1:
            raise UserError(f"--sentences {args.sentences}: give 1 or more")
        for path in args.checkpoints if args.tensorboard else []:
            print(f"{log_heatmaps(path, args)}: align/<i> images of {path}")
        if args.out is None:
            return 0
        images = []
        for path in args.checkpoints:
            result, title = attention_of(path, args)
            plot = AlignmentPlot(result.attention, result.src_tokens, result.tgt_tokens, title)
            images.append(plot.render())  # (H, W, 3)
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        imsave(out, side_by_side(images))
    except UserError as err:
        print(f"error: {cli_message(err)}", file=sys.stderr)
        return 2
    print(f"{out}: {len(images)} panel(s), pair {args.index} of {args.split}")
    return 0
