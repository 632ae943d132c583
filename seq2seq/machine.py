"""What a figure was measured on: the CPU (model, torch's capability level, native bf16 or not), the
commit of the checkout the package runs from (if any) and torch's version. The one place each is
read; studies, benchmarks and the launch checks all ask here.
"""

import datetime
import os
import platform
import subprocess
from pathlib import Path

import torch

# The package's own folder: git finds the checkout around it, if it runs from one.
PACKAGE = Path(__file__).resolve().parent


def cpu_model() -> str:
    """The CPU's model name as /proc/cpuinfo gives it (what `lscpu` prints); elsewhere, platform's."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:  # not Linux
        pass
    return platform.processor() or "unknown"


def native_bf16() -> bool:
    """Whether oneDNN runs bf16 on this CPU's own instructions (AVX512-BF16, AMX), not emulated."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def cpu_info() -> dict:
    """The CPU's model name, torch's capability level (e.g. AVX2, AVX512) and native bf16 or not."""
    return {
        "model": cpu_model(),
        "capability": torch.backends.cpu.get_cpu_capability(),
        "native_bf16": native_bf16(),
    }


def cores() -> int:
    """The cores this process may use (a SLURM allocation's, a `taskset`'s); all of the machine's
    where that is unknown (macOS has no affinity)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def cpu_line() -> str:
    """One line of what a speed depends on: "AMD EPYC, 2 cores, AVX2"."""
    return f"{cpu_model()}, {os.cpu_count()} cores, {torch.backends.cpu.get_cpu_capability()}"


def git_commit(short: bool = False) -> str:
    """The commit of the checkout holding this package, with `+dirty` when tracked files differ
    from it; '' for a package installed outside git."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", *(["--short"] if short else []), "HEAD"],
            cwd=PACKAGE, capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=PACKAGE, capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return ""
    return commit + ("+dirty" if dirty else "")


def provenance() -> dict[str, str]:
    """What a reader needs to rerun a figure: the commit, the CPU, torch's version, the time."""
    return {
        "commit": git_commit(),
        "cpu": cpu_line(),
        "torch": torch.__version__,
        "time": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
