"""The command line of training: the flags (one dataclass that is also the YAML schema and the run's
hparams.yaml) and their checks, built on the parser helpers every script shares (seq2seq.cli).

Precedence: dataclass defaults < `--config FILE` (YAML of the same keys) < explicit flags. Dashes and
underscores are interchangeable in YAML keys; an unknown key is an error. The library below takes plain
values and names its settings in errors; only this module knows how they are spelt as flags.
"""

import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from seq2seq.cli import DefaultsFormatter, Parser, add_flags, as_flag, base_type
from seq2seq.errors import UserError
from seq2seq.models.transformer_layers import POSITIONS
from seq2seq.training.yaml_config import read_yaml


def _opt(default: Any, help: str) -> Any:
    return field(default=default, metadata={"help": help})


# Epochs when --max-epochs is not given. In a GPU run planned for 40 epochs, the Transformer's validation
# BLEU levelled off after about 22 (README, Results), so its schedule now ends at 25.
DEFAULT_EPOCHS = {"rnn": 20, "transformer": 25}


@dataclass
class TrainConfig:
    # model
    model: Literal["rnn", "transformer"] = _opt("rnn", "model: the Bahdanau GRU or the Transformer")
    score: Literal["additive", "dot", "scaled"] = _opt("additive", "attention scorer (rnn)")
    emb_size: int = _opt(256, "embedding size (rnn)")
    hidden_size: int = _opt(512, "GRU hidden size; the encoder gives each direction half (rnn)")
    attn_size: int | None = _opt(None, "additive attention size; default: hidden size (rnn)")
    enc_layers: int = _opt(1, "encoder GRU layers (rnn)")
    d_model: int = _opt(256, "model width (transformer)")
    heads: int = _opt(4, "attention heads (transformer)")
    layers: int = _opt(3, "encoder and decoder layers each (transformer)")
    ff_size: int = _opt(1024, "feed-forward inner size (transformer)")
    post_ln: bool = _opt(False, "post-LN layers instead of pre-LN (transformer)")
    dropout: float = _opt(0.3, "dropout on embeddings, between layers and on output features")
    word_dropout: float = _opt(
        0.0,
        "while training, replace each source and target-input subword by <unk> with this "
        "probability (Sennrich et al. 2016; Gal and Ghahramani 2016)",
    )
    tie_embeddings: bool = _opt(
        True, "share source, target and output embeddings (joint vocabulary)"
    )
    alignment_layer: int = _opt(
        -1,
        "decoder layer whose cross-attention alignments and guidance use (-1: last) (transformer)",
    )
    alignment_heads: int = _opt(
        -1,
        "head of that layer that alignments and guidance use (-1: the mean of all heads) "
        "(transformer)",
    )
    # data
    dataset: str = _opt(
        "multi30k", "corpus name: data/NAME/, ../shared/data/NAME/, or a hub dataset"
    )
    data_dir: str | None = _opt(None, "folder of <split>.<lang>[.gz] files (overrides --dataset)")
    src: str = _opt("de", "source language")
    tgt: str = _opt("en", "target language")
    limit_train_pairs: int | None = _opt(None, "use only the first N training pairs")
    vocab_size: int = _opt(8000, "joint sentencepiece vocabulary size")
    max_len: int = _opt(100, "drop training pairs longer than this many subwords on either side")
    batch_tokens: int = _opt(2048, "token budget per batch (padded tokens of the longer side)")
    accumulate_grad_batches: int = _opt(1, "batches whose gradients add up to one update")
    num_workers: int = _opt(0, "data loader worker processes")
    cache_dir: str = _opt("data/cache", "folder of the tokenizer and the encoded corpus")
    spm_model: str | None = _opt(
        None, "an existing sentencepiece .model to use instead of training one"
    )
    spm_sample: int = _opt(
        500_000, "train sentencepiece on this many sentences sampled with --seed (1.6 GB peak)"
    )
    prepare_workers: int | None = _opt(
        None, "processes that encode the corpus (default: one per CPU core)"
    )
    # optimisation
    lr: float = _opt(1e-3, "peak learning rate (Adam)")
    lr_schedule: Literal["cosine", "inverse_sqrt"] = _opt(
        "cosine", "after warm-up: cosine decay to the last step, or 1/sqrt(step)"
    )
    warmup_steps: int = _opt(500, "linear warm-up steps (at most 10%% of the run)")
    min_lr_ratio: float = _opt(0.1, "the learning rate never falls below lr * this ratio")
    label_smoothing: float = _opt(0.1, "label smoothing of the cross-entropy")
    clip_norm: float = _opt(1.0, "gradient-norm clipping (0: off)")
    guided_alignment: str | None = _opt(
        None,
        "train attention to follow word alignments: a Pharaoh file (i-j, source word i, "
        "target word j; whitespace words from 0), one line per training pair",
    )
    guided_alignment_weight: float = _opt(
        0.1,
        "weight of the guided-alignment loss, per real target token like the translation "
        "loss (Marian's default; OpenNMT-py and fairseq use 0.05 for one Transformer head)",
    )
    guided_alignment_cost: Literal["ce", "mse"] = _opt(
        "ce", "guided-alignment loss: cross-entropy or squared error against the links"
    )
    max_epochs: int | None = _opt(
        None,
        f"stop after this many epochs (default: {DEFAULT_EPOCHS['rnn']} for rnn, "
        f"{DEFAULT_EPOCHS['transformer']} for transformer)",
    )
    max_minutes: float | None = _opt(
        None,
        "stop after this many minutes of this process (a resumed run gets its own), on an update "
        "boundary, with last.ckpt saved; exit status 4",
    )
    max_steps: int = _opt(-1, "stop after this many updates (-1: no limit)")
    val_every: int | None = _opt(None, "validate every N updates (default: once per epoch)")
    patience: int = _opt(0, "stop after N validations without a better BLEU (0: never)")
    keep_best: int = _opt(
        5, "keep the N checkpoints with the best validation BLEU (for average_checkpoints.py)"
    )
    keep_last: int = _opt(
        0,
        "also keep the checkpoints of the N latest validations as recent-<step>.ckpt, for "
        "averaging the last N (0: none)",
    )
    val_beam: int = _opt(1, "beam size for validation BLEU (1: greedy)")
    val_length_penalty: float = _opt(
        1.0, "alpha of the GNMT length penalty of validation's beam search (with --val-beam > 1)"
    )
    # run
    seed: int = _opt(1, "random seed (weights, batch order, dropout)")
    log_dir: str = _opt("lightning_logs", "where runs are written")
    run_name: str | None = _opt(
        None, "run folder under --log-dir (default: rnn-<score> or transformer)"
    )
    heatmap_every: int = _opt(500, "log alignment heatmaps every N updates (0: off)")
    heatmap_sentences: int = _opt(4, "number of fixed validation sentences shown as heatmaps")
    precision: str = _opt(
        "auto",
        "Lightning precision, e.g. 32-true, bf16-mixed; auto: bf16-mixed on a CPU with native bf16 "
        "(AVX512-BF16, AMX), where it measured faster and as good, else 32-true",
    )
    compile: bool = _opt(
        False,
        "compile the GRU decoder's loops (torch.compile; on a GPU also CUDA graphs, a path not yet "
        "measured on one)",
    )
    accelerator: str = _opt("auto", "Lightning accelerator: cpu, gpu, auto")
    devices: str = _opt("auto", "Lightning devices: a count, a list, or auto")
    num_nodes: int = _opt(1, "machines of a multi-node run (torchrun or SLURM)")
    strategy: str = _opt("auto", "Lightning strategy, e.g. ddp")
    stop_signal: Literal["USR1", "USR2", "INT", "HUP", "QUIT"] = _opt(
        "USR1",
        "besides SIGTERM, the signal that stops training politely (last.ckpt saved, exit status 4); "
        "SLURM: #SBATCH --signal=USR1@120, without B:, which signals only the batch shell and never "
        "train.py under srun",
    )
    resume: str | None = _opt(
        None, "continue a run: a checkpoint PATH, or the latest run when no PATH"
    )

    def __post_init__(self) -> None:
        if self.max_epochs is None:  # the Transformer needs more epochs to converge than the GRU
            self.max_epochs = DEFAULT_EPOCHS.get(self.model, DEFAULT_EPOCHS["rnn"])

    @property
    def name(self) -> str:
        """The run folder's name."""
        if self.run_name:
            return self.run_name
        return "transformer" if self.model == "transformer" else f"rnn-{self.score}"


POSITIVE = (
    "emb_size",
    "hidden_size",
    "enc_layers",
    "d_model",
    "heads",
    "layers",
    "ff_size",
    "vocab_size",
    "max_len",
    "batch_tokens",
    "max_epochs",
    "val_beam",
    "keep_best",
    "heatmap_sentences",
    "accumulate_grad_batches",
    "num_nodes",
    "spm_sample",
)


def validate(cfg: TrainConfig) -> TrainConfig:
    """Range and choice checks (YAML values skip argparse's); each failure names its flag."""
    hints = typing.get_type_hints(TrainConfig)
    for f in dataclasses.fields(TrainConfig):
        kind = base_type(hints[f.name])
        value = getattr(cfg, f.name)
        if typing.get_origin(kind) is Literal and value not in typing.get_args(kind):
            choices = ", ".join(typing.get_args(kind))
            raise UserError(f"{as_flag(f.name)} must be one of {choices}, got {value!r}")
    for name in POSITIVE:
        if getattr(cfg, name) <= 0:
            raise UserError(f"{as_flag(name)} must be positive, got {getattr(cfg, name)}")
    for name in ("limit_train_pairs", "val_every", "attn_size", "prepare_workers"):
        value = getattr(cfg, name)
        if value is not None and value <= 0:
            raise UserError(f"{as_flag(name)} must be positive, got {value}")
    for name in ("warmup_steps", "num_workers", "patience", "heatmap_every", "keep_last"):
        if getattr(cfg, name) < 0:
            raise UserError(f"{as_flag(name)} must be zero or more, got {getattr(cfg, name)}")
    if not 0.0 <= cfg.dropout < 1.0:
        raise UserError(f"--dropout must be in [0, 1), got {cfg.dropout}")
    if not 0.0 <= cfg.word_dropout < 1.0:
        raise UserError(f"--word-dropout must be in [0, 1), got {cfg.word_dropout}")
    if cfg.val_length_penalty < 0:
        raise UserError(f"--val-length-penalty must be zero or more, got {cfg.val_length_penalty}")
    if not 0.0 <= cfg.label_smoothing < 1.0:
        raise UserError(f"--label-smoothing must be in [0, 1), got {cfg.label_smoothing}")
    if cfg.max_minutes is not None and cfg.max_minutes <= 0:
        raise UserError(f"--max-minutes must be positive, got {cfg.max_minutes}")
    if cfg.lr <= 0:
        raise UserError(f"--lr must be positive, got {cfg.lr}")
    if cfg.max_steps == 0 or cfg.max_steps < -1:
        raise UserError(f"--max-steps must be positive or -1, got {cfg.max_steps}")
    if cfg.hidden_size % 2:
        raise UserError(
            f"--hidden-size must be even (each encoder direction gets half), got {cfg.hidden_size}"
        )
    if cfg.d_model % cfg.heads:
        raise UserError(f"--d-model {cfg.d_model} is not divisible by --heads {cfg.heads}")
    if cfg.compile and cfg.model != "rnn":
        raise UserError(
            f"--compile compiles the GRU decoder (--model rnn), not --model {cfg.model}"
        )
    if cfg.model == "transformer" and cfg.max_len >= POSITIONS:
        raise UserError(
            f"--max-len {cfg.max_len}: the Transformer has {POSITIONS:,} positions, one of them for "
            f"EOS or BOS; use --max-len {POSITIONS - 1} or less"
        )
    if cfg.src == cfg.tgt:
        raise UserError(f"--src and --tgt are both {cfg.src!r}")
    check_guided(cfg)  # its flags, and the Transformer's alignment head
    return cfg


def build_parser(description: str | None = None) -> Parser:
    """The training flags: one per TrainConfig field; --help shows every default."""
    parser = Parser(description=description, formatter_class=DefaultsFormatter)
    parser.add_argument(
        "--config", metavar="FILE", help="YAML file of these keys; flags override it"
    )
    add_flags(parser, TrainConfig)
    return parser


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    """Flags (and an optional YAML file) -> a validated TrainConfig."""
    parser = build_parser("Train an attention-based translator (see README.md).")
    known, _ = parser.parse_known_args(argv)
    if known.config:
        parser.set_defaults(**read_yaml(known.config, TrainConfig))
    args = vars(parser.parse_args(argv))
    args.pop("config")
    return validate(TrainConfig(**args))


def check_guided(cfg: Any) -> None:
    """Refuse bad guided-alignment settings of a TrainConfig, and a Transformer alignment head
    that does not exist, before any work begins."""
    if not -cfg.layers <= cfg.alignment_layer < cfg.layers:
        raise UserError(
            f"`alignment_layer` must be in -{cfg.layers}..{cfg.layers - 1} "
            f"(`layers` {cfg.layers}), got {cfg.alignment_layer}"
        )
    if not -1 <= cfg.alignment_heads < cfg.heads:
        raise UserError(
            f"`alignment_heads` must be -1 (mean) or a head in 0..{cfg.heads - 1}, "
            f"got {cfg.alignment_heads}"
        )
    if cfg.guided_alignment_weight < 0:
        raise UserError(
            f"`guided_alignment_weight` must be zero or more, got {cfg.guided_alignment_weight}"
        )
    if cfg.guided_alignment is not None and not Path(cfg.guided_alignment).is_file():
        raise UserError(f"`guided_alignment` {cfg.guided_alignment}: no such file")
