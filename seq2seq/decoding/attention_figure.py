"""One sentence's attention under several checkpoints, a panel each, side by side (`seq2seq
plot-attention` is its command line, which writes the image).

Every checkpoint reads pair `index` of `split` (from 0) of the corpus it was trained on, unless the
`PairChoice` names another, teacher-forced on the reference: each row is the attention the model used
to predict that reference subword, the figure `align/<i>` shows in TensorBoard. With a beam it shows
the attention behind the model's own translation instead. Each panel is
seq2seq.alignment.plotting.AlignmentPlot, titled with the checkpoint's model, decoder and scorer. A
checkpoint that holds a foresight head (`seq2seq fit-foresight`) gets a second panel right of its
attention: the same pair read by the head, whose query has read the word it aligns, titled
"foresight".
"""

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from seq2seq.alignment.plotting import AlignmentPlot, side_by_side
from seq2seq.alignment.words import Reading
from seq2seq.checkpoint import corpus_of, read_checkpoint
from seq2seq.data.corpus import Pairs, read_pairs, resolve_corpus
from seq2seq.decoding.translator import Translation, Translator
from seq2seq.errors import UserError


@dataclass(frozen=True)
class PairChoice:
    """Which pair a checkpoint reads: `index` (from 0) of `split` of the checkpoint's corpus, or of
    the corpus `dataset` or `data_dir` names instead; `src` and `tgt` default to the checkpoint's."""

    split: str = "val"
    index: int = 0
    dataset: str | None = None
    data_dir: str | None = None
    src: str | None = None
    tgt: str | None = None


@dataclass(frozen=True)
class Panel:
    """One checkpoint's attention on the chosen pair, drawn."""

    checkpoint: str
    title: str  # `<model>, <teacher-forced or beam K>[, foresight]: <file name>`
    translation: Translation  # the tokens and weights drawn (`translation.reading` names them)
    image: np.ndarray  # (H, W, 3) uint8


@dataclass(frozen=True)
class AttentionFigure:
    """The panels of the checkpoints in the order given, and their image joined left to right."""

    panels: tuple[Panel, ...]
    image: np.ndarray  # (max H, sum W + gaps, 3) uint8


def attention_figure(
    checkpoints: list[str | Path], choice: PairChoice = PairChoice(), beam: int = 0
) -> AttentionFigure:
    """The panels of each checkpoint (`checkpoint_panels`) on the pair `choice` names, in order:
    teacher-forced (`beam` 0) or the model's own translation with a beam of `beam`. A pair outside
    the split is a UserError naming --index."""
    panels = tuple(panel for path in checkpoints for panel in checkpoint_panels(path, choice, beam))
    return AttentionFigure(panels, side_by_side([panel.image for panel in panels]))


def checkpoint_panels(path: str | Path, choice: PairChoice, beam: int = 0) -> tuple[Panel, ...]:
    """The checkpoint's attention on the chosen pair, drawn and titled, and, when it holds a
    foresight head, the head's reading of the same translation beside it."""
    checkpoint = read_checkpoint(path)
    pairs = pairs_of(checkpoint, choice)
    sentence, reference = pairs.src[choice.index], pairs.tgt[choice.index]
    translator = Translator.load(path)
    how = f"beam {beam}" if beam else "teacher-forced"
    readings: list[Reading] = ["attention"] + (
        [] if translator.foresight is None else ["foresight"]
    )
    panels = []
    for reading in readings:
        if beam:
            [result] = translator.translate(
                [sentence], beam=beam, return_alignments=True, reading=reading
            )
        else:
            [result] = translator.align([sentence], [reference], reading=reading)
        named = "" if reading == "attention" else f", {reading}"
        title = f"{model_name(checkpoint['model_args'])}, {how}{named}: {Path(path).name}"
        plot = AlignmentPlot(result.attention, result.src_tokens, result.tgt_tokens, title)
        panels.append(Panel(str(path), title, result, plot.render()))
    return tuple(panels)


def pairs_of(checkpoint: dict, choice: PairChoice) -> Pairs:
    """The pairs of `choice.split` of the checkpoint's corpus (or the one `choice` names), checked
    to hold pair `choice.index`."""
    corpus = corpus_of(checkpoint) or {}
    if choice.dataset or choice.data_dir:  # a corpus given here replaces the checkpoint's entirely
        dataset, data_dir = choice.dataset, choice.data_dir
    else:  # its own corpus in another language than the model's: a slip, refused
        dataset, data_dir = corpus.get("dataset"), corpus.get("data_dir")
        for side, given in (("src", choice.src), ("tgt", choice.tgt)):
            flag, own = f"--{side}", corpus.get(side)
            if given and own and given != own:
                raise UserError(
                    f"{flag} {given}: the checkpoint translates {corpus['src']}->{corpus['tgt']} "
                    f"(leave {flag} out, or name a corpus with --data-dir or --dataset)"
                )
    src, tgt = choice.src or corpus.get("src") or "de", choice.tgt or corpus.get("tgt") or "en"
    source = resolve_corpus(dataset or "multi30k", data_dir)
    pairs = read_pairs(source, choice.split, src, tgt)
    if not 0 <= choice.index < len(pairs):
        raise UserError(
            f"--index {choice.index}: split {choice.split!r} of {source.location} has "
            f"{len(pairs):,} pairs, numbered 0 to {len(pairs) - 1:,}"
        )
    return pairs


def model_name(model_args: dict) -> str:
    """`rnn additive`, `rnn cgru dot`, ... or `transformer`: what a panel's title calls the model
    (the GRU's decoder named unless it is Bahdanau's, which checkpoints before the seam meant)."""
    kind = model_args.get("model", "rnn")
    if "score" not in model_args:
        return kind
    decoder = model_args.get("decoder", "bahdanau")
    return f"{kind} {'' if decoder == 'bahdanau' else decoder + ' '}{model_args['score']}"
