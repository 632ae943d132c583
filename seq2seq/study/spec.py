"""A study's spec: variants (each a set of `train.py` flags) times seeds, the split and beam they are
scored with; saved as `study.json` and checked, in one line naming what is wrong, before any training.
The folders a study keeps are seq2seq.study.layout's; running its runs is seq2seq.study.process's.

Paths (`align_ref`, and the path flags of `PATH_FLAGS` among the train.py flags) are resolved once,
where the spec is read, against the current folder: the study's processes all run there (the
checkout's root for the studies under docs/). In memory they are absolute, so every process of the
study finds the same files; `study.json` keeps those inside the current folder relative to it, so a
committed spec holds on any clone run from its root.
"""

import json
import os
import shlex
import signal
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from seq2seq.cli import CHECKS
from seq2seq.errors import UserError
from seq2seq.signals import STOPS

# Flags the study sets itself for every run; a variant may not set them.
OWN_FLAGS = ("--seed", "--log-dir", "--run-name", "--resume", "--max-minutes")
# train.py flags whose value is a path (resolved when the spec is read).
PATH_FLAGS = ("--data-dir", "--cache-dir", "--spm-model", "--guided-alignment", "--config")
# The stop signal a study's processes pass on to their children besides SIGTERM (seq2seq.signals.STOPS):
# a variant may not choose another, which the study would not forward (it would end the study).
FORWARDED_STOP = signal.Signals(STOPS[1]).name.removeprefix("SIG")
# The split the README's checkpoint rule chooses on: scoring on it would grade the choice itself.
CHOICE_SPLIT = "val"


@dataclass(frozen=True)
class StudySpec:
    """What a study trains and how it scores it; saved as `study.json` in the study folder."""

    variants: dict[str, list[str]]  # name -> train.py flags of that variant
    seeds: list[int]
    flags: list[str] = field(default_factory=list)  # train.py flags common to every variant
    split: str = "test"  # the split every run is scored on
    beam: int = 5
    align_ref: str | None = None  # a silver/gold Pharaoh file for that split: AER too

    def runs(self) -> list["Run"]:
        """Every (variant, seed), seed-major: a partial study has every variant at its first seeds."""
        return [Run(variant, seed) for seed in self.seeds for variant in self.variants]

    def train_flags(self, run: "Run") -> list[str]:
        return [*self.flags, *self.variants[run.variant], "--seed", str(run.seed)]

    def portable(self) -> "StudySpec":
        """The spec with paths inside the current folder relative to it (as study.json keeps them)."""
        return replace(
            self,
            variants={name: map_paths(flags, relative) for name, flags in self.variants.items()},
            flags=map_paths(self.flags, relative),
            align_ref=relative(self.align_ref) if self.align_ref is not None else None,
        )

    def to_json(self) -> str:
        return json.dumps(asdict(self.portable()), indent=2) + "\n"

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str, base: Path) -> "StudySpec":
        """A spec from a dict (study.json or a YAML file); values are checked, `where` names the file,
        relative paths are taken from the folder `base`."""
        known = {"variants", "seeds", "flags", "split", "beam", "align_ref"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise UserError(
                f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(known))})"
            )
        variants = data.get("variants") or {}
        if not isinstance(variants, dict):
            raise UserError(f"{where}: `variants` must map names to train.py flags")
        seeds = data.get("seeds") or []
        if not isinstance(seeds, list) or not all(
            isinstance(s, int) and not isinstance(s, bool) for s in seeds
        ):
            raise UserError(f"{where}: `seeds` must be a list of integers, got {seeds!r}")
        beam = data.get("beam", 5)
        if not isinstance(beam, int) or isinstance(beam, bool):
            raise UserError(f"{where}: `beam` must be an integer, got {beam!r}")
        split, align_ref = data.get("split", "test"), data.get("align_ref")
        if not isinstance(split, str):
            raise UserError(f"{where}: `split` must be a split's name, got {split!r}")
        if align_ref is not None and not isinstance(align_ref, str):
            raise UserError(f"{where}: `align_ref` must be a file's path, got {align_ref!r}")

        def absolute(path: str) -> str:
            return os.path.normpath(base / Path(path).expanduser())  # an absolute one stays

        return cls(
            variants={
                str(name): map_paths(as_flags(value, f"{where}: variant {name}"), absolute)
                for name, value in variants.items()
            },
            seeds=seeds,
            flags=map_paths(as_flags(data.get("flags"), f"{where}: `flags`"), absolute),
            split=split,
            beam=beam,
            align_ref=absolute(align_ref) if align_ref is not None else None,
        )


def as_flags(value: str | list[str] | None, what: str) -> list[str]:
    """Flags given as one shell-quoted string (`--score dot --lr 1e-3`), as a list of words, or none
    (`default:` in YAML, the variant of train.py's defaults)."""
    if value is None:
        return []
    if isinstance(value, str):
        try:
            return shlex.split(value)
        except ValueError as err:  # an unclosed quote
            raise UserError(f"{what}: cannot split {value!r} into flags ({err})") from None
    if isinstance(value, list) and all(isinstance(word, str | int | float) for word in value):
        return [str(word) for word in value]
    raise UserError(f"{what}: flags must be one string or a list of words, got {value!r}")


def map_paths(flags: list[str], how: Any) -> list[str]:
    """`flags` with `how(value)` in place of the value of each flag of PATH_FLAGS (`--flag value`
    and `--flag=value` alike)."""
    out, flags = [], list(flags)
    for i, word in enumerate(flags):
        name, equals, value = word.partition("=")
        if name in PATH_FLAGS and equals:
            out.append(f"{name}={how(value)}")
        elif i > 0 and flags[i - 1] in PATH_FLAGS:
            out.append(how(word))
        else:
            out.append(word)
    return out


def relative(path: str) -> str:
    """`path` relative to the current folder when it lies inside it; otherwise as it is."""
    try:
        return str(Path(path).relative_to(Path.cwd()))
    except ValueError:
        return path


@dataclass(frozen=True)
class Run:
    variant: str
    seed: int

    @property
    def name(self) -> str:
        return f"{self.variant}-seed{self.seed}"


def check_spec(spec: StudySpec) -> None:
    """Refuse a spec that cannot run, in one line naming what is wrong, before anything is trained."""
    from seq2seq.training.config import parse_args

    if not spec.variants:
        raise UserError("a study needs at least one variant (--variant NAME FLAGS)")
    if not spec.seeds:
        raise UserError("a study needs at least one seed (--seeds 1 2 3)")
    if len(set(spec.seeds)) != len(spec.seeds):
        raise UserError(f"--seeds lists a seed twice: {spec.seeds}")
    in_range, seeds_are = CHECKS["seed"]  # train's --seed: refused now, not at the run's start
    for seed in spec.seeds:
        if not in_range(seed):
            raise UserError(f"--seeds {seed}: {seeds_are}")
    if spec.beam <= 0:
        raise UserError(f"--beam must be positive, got {spec.beam}")
    if spec.split == CHOICE_SPLIT:
        raise UserError(
            f"--split {CHOICE_SPLIT}: each run's checkpoint is chosen on {CHOICE_SPLIT}, so its "
            "score there is biased; score on a split nothing was chosen on (test)"
        )
    if spec.align_ref is not None and not Path(spec.align_ref).is_file():
        raise UserError(f"--align-ref {spec.align_ref}: no such file")
    for name, flags in spec.variants.items():
        if not name or not all(c.isalnum() or c in "-_." for c in name):
            raise UserError(f"variant name {name!r}: use letters, digits, '-', '_' and '.' only")
        for flag in (*spec.flags, *flags):
            if flag.split("=")[0] == "--max-minutes":
                raise UserError(
                    f"variant {name}: --max-minutes limits a sitting, not a variant; give it to "
                    "`study.py run` or `study.py one`"
                )
            if flag.split("=")[0] in OWN_FLAGS:
                raise UserError(f"variant {name}: {flag.split('=')[0]} is set by the study itself")
        try:  # train.py's own checks: a typo is refused now, not after an hour of other runs
            cfg = parse_args([*spec.flags, *flags])
        except SystemExit:  # argparse printed its one-line usage error already
            raise UserError(
                f"variant {name}: train.py refuses its flags ({shlex.join(flags)})"
            ) from None
        if cfg.stop_signal != FORWARDED_STOP:
            raise UserError(
                f"variant {name}: --stop-signal {cfg.stop_signal}: a study passes SIGTERM and "
                f"SIG{FORWARDED_STOP} on to its runs, no other; leave --stop-signal out and have the "
                f"scheduler send SIG{FORWARDED_STOP} (SLURM: --signal={FORWARDED_STOP}@120)"
            )
