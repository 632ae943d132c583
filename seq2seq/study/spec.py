"""A study's spec: variants (each a set of `train.py` flags) times seeds, the split and beam they are
scored with; saved as `study.json` and checked, in one line naming what is wrong, before any training.
The folders a study keeps are seq2seq.study.layout's; running its runs is seq2seq.study.process's.
"""

import json
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from seq2seq.errors import UserError

# Flags the study sets itself for every run; a variant may not set them.
OWN_FLAGS = ("--seed", "--log-dir", "--run-name", "--resume", "--max-minutes")


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

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str) -> "StudySpec":
        """A spec from a dict (study.json or a YAML file); values are checked, `where` names the file."""
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
        if not isinstance(seeds, list) or not all(isinstance(s, int) for s in seeds):
            raise UserError(f"{where}: `seeds` must be a list of integers, got {seeds!r}")
        return cls(
            variants={str(name): as_flags(value) for name, value in variants.items()},
            seeds=seeds,
            flags=as_flags(data.get("flags") or []),
            split=str(data.get("split", "test")),
            beam=int(data.get("beam", 5)),
            align_ref=data.get("align_ref"),
        )


def as_flags(value: str | list[str]) -> list[str]:
    """Flags given as one shell-quoted string (`--score dot --lr 1e-3`) or as a list of words."""
    return shlex.split(value) if isinstance(value, str) else [str(word) for word in value]


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
    if spec.beam <= 0:
        raise UserError(f"--beam must be positive, got {spec.beam}")
    if spec.align_ref is not None and not Path(spec.align_ref).is_file():
        raise UserError(f"--align-ref {spec.align_ref}: no such file")
    for name, flags in spec.variants.items():
        if not name or not all(c.isalnum() or c in "-_." for c in name):
            raise UserError(f"variant name {name!r}: use letters, digits, '-', '_' and '.' only")
        for flag in (*spec.flags, *flags):
            if flag.split("=")[0] in OWN_FLAGS:
                raise UserError(f"variant {name}: {flag.split('=')[0]} is set by the study itself")
        try:  # train.py's own checks: a typo is refused now, not after an hour of other runs
            parse_args([*spec.flags, *flags])
        except SystemExit:  # argparse printed its one-line usage error already
            raise UserError(
                f"variant {name}: train.py refuses its flags ({shlex.join(flags)})"
            ) from None
