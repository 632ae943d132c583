"""The data settings: one dataclass, `DataConfig`, whose fields are the training flags of the corpus,
the tokenizer, the cache and the batches (`--src`, `--vocab-size`, `--batch-tokens`, ...).

Each setting is stated here once, with its help and its range. The data layer reads its settings from a
`DataConfig` (a `seq2seq.training.config.TrainConfig` is one: the union of every layer's settings) and
never imports the training layer.
"""

from dataclasses import dataclass
from pathlib import Path

from seq2seq.cli import ModelDefaults, option, tagged
from seq2seq.errors import UserError
from seq2seq.recipes import RECIPE

# A field tagged ORDER fixes the order of training batches: a resumed run must keep it (`order_fields`).
ORDER = "batch-order"


@dataclass
class DataConfig(ModelDefaults):
    """data: the corpus, its tokenizer and cache, and the training batches"""

    dataset: str = option(
        "multi30k", "corpus name: data/NAME/, ../shared/data/NAME/, or a hub dataset"
    )
    data_dir: str | None = option(None, "folder of <split>.<lang>[.gz] files (overrides --dataset)")
    src: str = option("de", "source language")
    tgt: str = option("en", "target language")
    limit_train_pairs: int | None = option(
        None, "use only the first N training pairs", check="positive", tags=(ORDER,)
    )
    vocab_size: int = option(8000, "joint sentencepiece vocabulary size", check="positive")
    max_len: int = option(
        100,
        "drop training pairs longer than this many subwords on either side",
        check="positive",
        tags=(ORDER,),
    )
    batch_tokens: int = option(
        None,
        "token budget per batch (padded tokens of the longer side)",
        check="positive",
        tags=(ORDER,),
        per_model=RECIPE["batch_tokens"],
    )
    accumulate_grad_batches: int = option(
        1, "batches whose gradients add up to one update", check="positive", tags=(ORDER,)
    )
    num_workers: int = option(0, "data loader worker processes", check="non-negative")
    cache_dir: str = option("data/cache", "folder of the tokenizer and the encoded corpus")
    spm_model: str | None = option(
        None, "an existing sentencepiece .model to use instead of training one"
    )
    spm_sample: int = option(
        500_000,
        "train sentencepiece on this many sentences sampled with --seed (1.6 GB peak)",
        check="positive",
    )
    prepare_workers: int | None = option(
        None, "processes that encode the corpus (default: one per CPU core)", check="positive"
    )
    guided_alignment: str | None = option(
        None,
        "train attention to follow word alignments: a Pharaoh file (i-j, source word i, "
        "target word j; whitespace words from 0), one line per training pair",
    )
    # The run's seed lives here because the data layer is the lowest one that reads it (the tokenizer's
    # sample, the batch order); training seeds the weights and dropout from the same field.
    seed: int = option(
        1, "random seed (weights, batch order, dropout)", check="seed", tags=(ORDER,)
    )

    def check(self) -> None:
        """The checks that tie settings together or look at a file (ranges: `check_fields`)."""
        if self.src == self.tgt:
            raise UserError(f"`src` and `tgt` are both {self.src!r}")
        if self.guided_alignment is not None and not Path(self.guided_alignment).is_file():
            raise UserError(f"`guided_alignment` {self.guided_alignment}: no such file")


def order_fields() -> tuple[str, ...]:
    """The settings that fix the order of training batches (a resume must keep them)."""
    return tagged(DataConfig, ORDER)
