"""The hardware flags of a run (`accelerator`, `devices`, `strategy`, `precision`), checked before any
data work: a typo must cost a one-line error at once, not a traceback per rank after minutes of
preparation. Names are checked against Lightning's own registries; what is not available here (a GPU
asked for on a machine without one) is refused too. What these checks let through, Lightning judges
when the Trainer is built, which `train.py` also does before preparing data (`trainer_error`).
"""

from __future__ import annotations

import difflib
import re
import typing

import torch
from lightning.fabric import connector
from lightning.pytorch.strategies import StrategyRegistry

from seq2seq.errors import UserError
from seq2seq.machine import native_bf16

ACCELERATORS = ("auto", "cpu", "gpu", "cuda", "mps", "tpu")
# Lightning's precision names, and the short forms it also takes.
PRECISIONS = (*typing.get_args(connector._PRECISION_INPUT_STR), "64", "32", "16", "bf16")
# The figures are scripts/benchmark.py's on such a machine (docs/results/benchmarks.md).
SLOW_BF16 = (
    "warning: --precision {precision}: this CPU has no native bf16 (capability {capability}), and "
    "there bf16 measured 14x slower than fp32 (161 against 2,190 target tokens/s on an AVX2 AMD "
    "EPYC); --precision 32-true is the fast choice here"
)


def resolve_precision(accelerator: str, precision: str, resumed: dict | None = None) -> str:
    """`auto` made concrete. A resumed run (`resumed`: its checkpoint) keeps the precision it began
    in, so the same command with --resume continues it as it started; a checkpoint written before
    `auto` existed trained in the default of then, 32-true. A new run: bf16-mixed on a CPU with
    native bf16, where it trained faster than fp32 (scripts/benchmark.py) and scored alike over
    three seeds (docs/results/study.md, the bf16 study); else 32-true, on GPUs too, where bf16
    trained slower than fp32 (docs/results/benchmarks.md, on an H200). Any other name is returned as
    given."""
    if precision != "auto":
        return precision
    if resumed is not None:
        return resumed.get("precision", "32-true")
    return "bf16-mixed" if _on_cpu(accelerator) and native_bf16() else "32-true"


def _on_cpu(accelerator: str) -> bool:
    return accelerator == "cpu" or (accelerator == "auto" and not torch.cuda.is_available())


def check_hardware(accelerator: str, devices: str, strategy: str, precision: str) -> None:
    """Refuse (UserError naming the flag) an unknown or unavailable setting."""
    if accelerator not in ACCELERATORS:
        raise UserError(f"--accelerator {accelerator}: not one of {', '.join(ACCELERATORS)}")
    if accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
        raise UserError(
            f"--accelerator {accelerator}: no CUDA GPU here; use --accelerator cpu (or auto)"
        )
    if accelerator == "mps" and not torch.backends.mps.is_available():
        raise UserError("--accelerator mps: no Apple GPU here; use --accelerator cpu (or auto)")
    _check_devices(devices, accelerator)
    strategies = ("auto", *StrategyRegistry.available_strategies())
    if strategy not in strategies:
        close = difflib.get_close_matches(strategy, strategies, n=1)
        hint = f"did you mean {close[0]}?" if close else "e.g. auto, ddp"
        raise UserError(f"--strategy {strategy}: not a Lightning strategy ({hint})")
    if precision not in ("auto", *PRECISIONS):
        common = ", ".join(p for p in PRECISIONS if "-" in p and "engine" not in p)
        raise UserError(
            f"--precision {precision}: not a Lightning precision (auto or one of {common})"
        )


def slow_precision(accelerator: str, precision: str) -> str | None:
    """A one-line warning for a precision that works but is slow here (bf16 on a CPU without native
    bf16), else None."""
    bf16 = precision.startswith("bf16") or precision in ("16-mixed", "16")  # Lightning: bf16 on CPU
    if _on_cpu(accelerator) and bf16 and not native_bf16():
        capability = torch.backends.cpu.get_cpu_capability()
        return SLOW_BF16.format(precision=precision, capability=capability)
    return None


def _check_devices(devices: str, accelerator: str) -> None:
    """`devices` is auto, -1 (all), a positive count, or a comma list of indices (0,1)."""
    if devices in ("auto", "-1"):
        return
    if re.fullmatch(r"\d+", devices):
        count = int(devices)
        if count == 0:
            raise UserError("--devices 0: use a positive count, a list of indices (0,1), or auto")
    elif re.fullmatch(r"\d+(,\d+)*,?", devices):
        count = len(devices.strip(",").split(","))
    else:
        raise UserError(
            f"--devices {devices}: not a count, a list of indices (0,1), -1 (all) or auto"
        )
    gpus = torch.cuda.device_count()
    if accelerator in ("gpu", "cuda") and count > gpus:
        raise UserError(f"--devices {devices}: this machine has {gpus} CUDA GPU(s)")


def trainer_error(err: Exception, flags: dict[str, str]) -> UserError:
    """Lightning's refusal of a flag combination, as one line naming the flags."""
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    first = first.replace("`", "'")  # backquotes in our messages mark settings (cli_message)
    named = " ".join(f"--{name.replace('_', '-')} {value}" for name, value in flags.items())
    return UserError(f"{named}: {first}")
