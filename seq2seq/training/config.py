"""The command line of training: the flags (one dataclass that is also the YAML schema and the run's
hparams.yaml) and their checks, built on the parser helpers every script shares (seq2seq.cli).

`TrainConfig` is the union of each layer's settings, every one stated once, with its help and range:
`ModelConfig` (seq2seq.models.config), `DataConfig` (seq2seq.data.config), and here `OptimConfig`
(what `TranslationSystem` trains with), `ValidationConfig` (validation and the checkpoints kept) and
`RunConfig` (the run's folder, hardware, stops). It subclasses all five, so the flags, the YAML keys
and hparams.yaml stay flat, and each layer is handed the whole config typed as its own part.

Precedence: dataclass defaults < `--config FILE` (YAML of the same keys) < explicit flags. Dashes and
underscores are interchangeable in YAML keys; an unknown key is an error. The library below takes plain
values and names its settings in errors (`name`); `parse_args` spells them as flags (--name).

A recipe setting (`seq2seq.recipes`: `lr`, `dropout`, `batch_tokens`, ...) left unset follows `model`:
`TrainConfig(model="transformer")` and `dataclasses.replace(TrainConfig(), model="transformer")` both
train the Transformer's recipe, and a value given wins whatever the model. `validate` is the one place
that settles them into plain values, which hparams.yaml and the checkpoints record.
"""

import dataclasses
import typing
from dataclasses import dataclass
from typing import Literal

from seq2seq.cli import (
    DefaultsFormatter,
    ModelDefaults,
    Parser,
    add_flags,
    check_fields,
    cli_message,
    option,
    per_model_fields,
)
from seq2seq.data.config import DataConfig
from seq2seq.errors import UserError
from seq2seq.models.build import check_kind
from seq2seq.models.config import ModelConfig
from seq2seq.recipes import RECIPE
from seq2seq.training.yaml_config import checked_value, read_yaml

# Warm-up updates when --warmup-steps is not given, cut to a tenth of a shorter run's updates.
DEFAULT_WARMUP = 500


@dataclass
class OptimConfig(ModelDefaults):
    """optimisation: the optimiser, its schedule and the loss (what `TranslationSystem` trains with)"""

    lr: float = option(None, "peak learning rate (Adam)", check="positive", per_model=RECIPE["lr"])
    lr_schedule: Literal["cosine", "inverse_sqrt"] = option(
        "cosine", "after warm-up: cosine decay to the last step, or 1/sqrt(step)"
    )
    warmup_steps: int | None = option(
        None,
        f"linear warm-up steps (default: {DEFAULT_WARMUP}, at most a tenth of the run; a number "
        "given is taken whole): update k of N runs at lr * k / N, so the first at lr / N, not 0; "
        "fairseq's --warmup-init-lr 1e-7 starts lower but is never more than lr / N apart (one "
        "update's step), so there is no such flag",
        check="non-negative",
    )
    min_lr_ratio: float = option(0.1, "the learning rate never falls below lr * this ratio")
    label_smoothing: float = option(0.1, "label smoothing of the cross-entropy", check="fraction")
    clip_norm: float = option(1.0, "gradient-norm clipping (0: off)", check="non-negative")
    word_dropout: float = option(
        None,
        "while training, replace each source and target-input subword by <unk> with this "
        "probability (Sennrich et al. 2016; Gal and Ghahramani 2016)",
        check="fraction",
        per_model=RECIPE["word_dropout"],
    )
    guided_alignment_weight: float = option(
        0.1,
        "weight of the guided-alignment loss, per real target token like the translation "
        "loss (Marian's default; OpenNMT-py and fairseq use 0.05 for one Transformer head)",
        check="non-negative",
    )
    guided_alignment_cost: Literal["ce", "mse"] = option(
        "ce", "guided-alignment loss: cross-entropy or squared error against the links"
    )

    def check(self) -> None:
        """The checks a range of `option` cannot state."""
        if not 0.0 <= self.min_lr_ratio <= 1.0:  # below 0 the cosine would drive the rate negative
            raise UserError(f"`min_lr_ratio` must be in [0, 1], got {self.min_lr_ratio}")


@dataclass
class ValidationConfig(ModelDefaults):
    """validation: when it runs, how it searches, and which checkpoints it keeps"""

    val_every: int | None = option(
        None, "validate every N updates (default: once per epoch)", check="positive"
    )
    val_beam: int = option(1, "beam size for validation BLEU (1: greedy)", check="positive")
    val_length_penalty: float = option(
        1.0,
        "alpha of the GNMT length penalty of validation's beam search (with --val-beam > 1)",
        check="non-negative",
    )
    patience: int = option(
        0,
        "stop after N validations in a row without a better --patience-metric (0: never)",
        check="non-negative",
    )
    patience_metric: Literal["bleu", "loss"] = option(
        "bleu",
        "what --patience waits on: a higher validation BLEU, or a lower validation loss "
        "(val/loss, the NLL per target token; fairseq's --patience counts its loss)",
    )
    keep_best: int = option(
        5,
        "keep the N checkpoints with the best validation BLEU (for average_checkpoints.py)",
        check="positive",
    )
    keep_last: int = option(
        0,
        "also keep the checkpoints of the N latest validations as recent-<step>.ckpt, for "
        "averaging the last N (0: none); with one validation an epoch (no --val-every) these "
        "are the last N epochs' end checkpoints, as fairseq averages them",
        check="non-negative",
    )
    heatmap_every: int = option(
        500, "log alignment heatmaps every N updates (0: off)", check="non-negative"
    )
    heatmap_sentences: int = option(
        4, "number of fixed validation sentences shown as heatmaps", check="positive"
    )


@dataclass
class RunConfig(ModelDefaults):
    """run: when it stops, where it is written, and on what hardware"""

    max_epochs: int = option(
        None, "stop after this many epochs", check="positive", per_model=RECIPE["max_epochs"]
    )
    max_minutes: float | None = option(
        None,
        "stop after this many minutes of this process (a resumed run gets its own), on an update "
        "boundary, with last.ckpt saved; exit status 4",
        check="positive",
    )
    max_steps: int = option(-1, "stop after this many updates (-1: no limit)")
    log_dir: str = option("lightning_logs", "where runs are written")
    run_name: str | None = option(
        None,
        "run folder under --log-dir (default: rnn-<score>, rnn-<decoder>-<score> for a decoder "
        "other than bahdanau, or transformer)",
    )
    precision: str = option(
        "auto",
        "Lightning precision, e.g. 32-true, bf16-mixed; auto: bf16-mixed on a CPU with native bf16 "
        "(AVX512-BF16, AMX), where it measured faster and as good, else 32-true",
    )
    compile: bool = option(
        False,
        "compile the GRU decoder's loops (torch.compile; on a GPU also CUDA graphs, a path not yet "
        "measured on one)",
    )
    accelerator: str = option("auto", "Lightning accelerator: cpu, gpu, auto")
    devices: str = option("auto", "Lightning devices: a count, a list, or auto")
    num_nodes: int = option(1, "machines of a multi-node run (torchrun or SLURM)", check="positive")
    strategy: str = option("auto", "Lightning strategy, e.g. ddp")
    stop_signal: Literal["USR1", "USR2", "INT", "HUP", "QUIT"] = option(
        "USR1",
        "besides SIGTERM, the signal that stops training politely (last.ckpt saved, exit status 4); "
        "SLURM: #SBATCH --signal=USR1@120, without B:, which signals only the batch shell and never "
        "train.py under srun",
    )
    resume: str | None = option(
        None, "continue a run: a checkpoint PATH, or the latest run when no PATH"
    )


class RecipeFloat(float):
    """A float a `TrainConfig` took from its model's recipe, not given: it follows `model` through
    `dataclasses.replace`. Pickled (a checkpoint, a copy) it is a plain float."""

    def __reduce__(self) -> tuple:
        return float, (float(self),)


class RecipeInt(int):
    """An int a `TrainConfig` took from its model's recipe (see `RecipeFloat`)."""

    def __reduce__(self) -> tuple:
        return int, (int(self),)


RECIPE_TYPES: dict[type, type] = {float: RecipeFloat, int: RecipeInt}

# The layers' settings TrainConfig is made of, lowest layer first; each checks its own (`check`).
PARTS = (ModelConfig, DataConfig, OptimConfig, ValidationConfig, RunConfig)

# A setting read only when another is set: (it, the setting it needs, set how, is that so).
NEEDS: tuple[tuple[str, str, str, typing.Callable[[typing.Any], bool]], ...] = (
    ("guided_alignment_weight", "guided_alignment", "FILE", lambda c: c.guided_alignment),
    ("guided_alignment_cost", "guided_alignment", "FILE", lambda c: c.guided_alignment),
    ("patience_metric", "patience", "N above 0", lambda c: c.patience > 0),
    ("val_length_penalty", "val_beam", "N above 1", lambda c: c.val_beam > 1),
    ("heatmap_sentences", "heatmap_every", "N above 0", lambda c: c.heatmap_every > 0),
)


def check_needs(cfg: typing.Any) -> None:
    """Refuse a setting given (other than its default) that nothing reads without another one:
    `--patience-metric loss` with no `--patience` trained to the end as if it were not there."""
    fields = {f.name: f for f in dataclasses.fields(cfg)}
    for name, needs, how, is_set in NEEDS:
        value = getattr(cfg, name)
        if value != fields[name].default and not is_set(cfg):
            raise UserError(
                f"`{name}` {value}: read only with `{needs}` {how} (give that, or leave this out)"
            )


# The flags' order in --help and hparams.yaml: dataclass fields come base class last to first.
@dataclass
class TrainConfig(RunConfig, ValidationConfig, OptimConfig, DataConfig, ModelConfig):
    """Every setting of a training run: the union of the layers' settings, flat."""

    def __post_init__(self) -> None:
        # A recipe setting left unset, or taken from the recipe of the `model` this config was
        # copied from, takes this model's value, marked as the recipe's (`RecipeFloat`).
        for name in per_model_fields(type(self)):
            value = getattr(self, name)
            if value is None or isinstance(value, RecipeFloat | RecipeInt):
                defaults = self.__dataclass_fields__[name].metadata["per_model"]
                default = defaults.get(self.model, next(iter(defaults.values())))
                setattr(self, name, RECIPE_TYPES[type(default)](default))

    @property
    def name(self) -> str:
        """The run folder's name."""
        if self.run_name:
            return self.run_name
        if self.model == "transformer":
            return "transformer"
        decoder = (
            "" if self.decoder == "bahdanau" else f"{self.decoder}-"
        )  # apart from the default's
        return f"rnn-{decoder}{self.score}"

    def check(self) -> None:
        """Each part's own checks (`PARTS`), then those across parts. Called on the whole config,
        a part's `check` alone would shadow the others'."""
        for part_class in PARTS:
            own = part_class.__dict__.get("check")
            if own is not None:
                own(self)
        if self.max_steps == 0 or self.max_steps < -1:
            raise UserError(f"`max_steps` must be positive or -1, got {self.max_steps}")
        if self.compile and self.model != "rnn":
            raise UserError(
                f"`compile` compiles the GRU decoder (--model rnn), not --model {self.model}"
            )
        if self.positions is not None and self.max_len > self.positions:
            raise UserError(
                f"`max_len` {self.max_len}: the Transformer has {self.positions + 1:,} positions, "
                f"one of them for EOS or BOS; use --max-len {self.positions} or less"
            )
        check_kind(self)  # last: a range refused above says more than "leave it out"
        check_needs(self)


def validate(cfg: TrainConfig) -> TrainConfig:
    """`cfg` checked and settled: each value's type (a library caller's config has not been through
    argparse: `lr="1e-3"` is refused, `devices=2` read as "2", as in a YAML file), each field's choices
    and range, each part's checks and those across parts (`TrainConfig.check`); a failure names its
    setting (`name`; `parse_args` spells it --name). Returns the config with its recipe settings as
    plain values (what hparams.yaml and the checkpoints record)."""
    hints = typing.get_type_hints(TrainConfig)
    values = {
        f.name: checked_value(getattr(cfg, f.name), hints[f.name], f"`{f.name}`")
        for f in dataclasses.fields(cfg)
    }
    for name, value in values.items():
        if isinstance(value, RecipeFloat | RecipeInt):  # settled: it no longer follows `model`
            values[name] = type(value).__mro__[1](value)
    cfg = dataclasses.replace(cfg, **values)
    check_fields(cfg)
    cfg.check()
    return cfg


def build_parser(description: str | None = None, prog: str | None = None) -> Parser:
    """The training flags: one per TrainConfig field; --help shows every default. `prog`: the
    command's name in usage and errors (default: the script's file name)."""
    parser = Parser(prog=prog, description=description, formatter_class=DefaultsFormatter)
    parser.add_argument(
        "--config", metavar="FILE", help="YAML file of these keys; flags override it"
    )
    add_flags(parser, TrainConfig)
    return parser


def parse_args(argv: list[str] | None = None, prog: str | None = None) -> TrainConfig:
    """Flags (and an optional YAML file) -> a validated TrainConfig."""
    parser = build_parser("Train an attention-based translator (see README.md).", prog)
    known, _ = parser.parse_known_args(argv)
    if known.config:
        parser.set_defaults(**read_yaml(known.config, TrainConfig))
    args = vars(parser.parse_args(argv))
    args.pop("config")
    try:
        return validate(TrainConfig(**args))
    except UserError as err:
        raise UserError(cli_message(err)) from None
