"""Average the weights of checkpoints of one run, as fairseq, OpenNMT-py and Joey NMT offer.

    seq2seq average run/checkpoints/best-*.ckpt run/checkpoints/last.ckpt --out avg.ckpt

(`seq2seq.commands.average`; from Python, `average_checkpoints(paths, out)`.)

The result is a checkpoint like any other for evaluate.py and translate.py (model and tokenizer inside),
written atomically. Checkpoints whose model arguments or tokenizer differ are refused: their parameters do not
live in one space, so their mean means nothing; so is a file given twice (it would count twice) and an
`out` that is one of them, before any is read. The averaged file carries no optimizer state: it is for
decoding, not for resuming, and no foresight head (fit one on it).
"""

import os
from pathlib import Path
from typing import Any

from seq2seq.atomic import check_writable_file
from seq2seq.errors import UserError
from seq2seq.models.build import complete_args

KEPT = ("epoch", "global_step", "pytorch-lightning_version", "hyper_parameters", "seq2seq_version",
        "model_args", "tokenizer")  # fmt: skip


def average_checkpoints(paths: list[str], out: str | Path, notes: list[str] | None = None) -> Path:
    """Mean of the floating-point weights of `paths`, saved to `out` with the first one's config.
    What the mean leaves out (a foresight head, fitted to one model's states) is said in `notes`."""
    from seq2seq.alignment.foresight import CHECKPOINT_KEY
    from seq2seq.checkpoint import atomic_save, read_checkpoint

    if len(paths) < 2:
        raise UserError(f"averaging needs two or more checkpoints, got {len(paths)}")
    check_once(paths)
    check_writable_file(out, f"--out {out}", paths)  # before the reading, not after it
    first = read_checkpoint(paths[0])
    headed = [paths[0]] if CHECKPOINT_KEY in first else []
    groups = tied_groups(first["state_dict"])
    total = {
        name: value.double() if value.is_floating_point() else value
        for name, value in first["state_dict"].items()
        if name in groups
    }
    for path in paths[1:]:
        other = read_checkpoint(path)
        check_same_run(paths[0], first, path, other)
        headed += [path] if CHECKPOINT_KEY in other else []
        for name in groups:
            value = other["state_dict"][name]
            if value.is_floating_point():
                total[name] += value.double()  # float64 sums: no rounding drift over many files
    state = {}
    for name, tied in groups.items():
        value = first["state_dict"][name]
        mean = (total[name] / len(paths)).to(value.dtype) if value.is_floating_point() else value
        for alias in tied:  # tied weights stay one tensor: saved once, loaded as one
            state[alias] = mean
    state = {name: state[name] for name in first["state_dict"]}  # the original order
    averaged = {key: first[key] for key in KEPT if key in first}
    averaged["state_dict"] = state
    averaged["averaged_from"] = [str(p) for p in paths]
    out = Path(out)
    try:
        atomic_save(averaged, out)
    except OSError as err:
        raise UserError(f"--out {out}: cannot write ({err.strerror})") from None
    if headed and notes is not None:
        notes.append(
            f"the foresight head of {', '.join(headed)} is not in {out}: a head reads the states of "
            f"the model it was fitted on; fit one on the average (seq2seq fit-foresight {out} --out "
            "CKPT2)"
        )
    return out


def check_once(paths: list[str]) -> None:
    """Refuse a checkpoint given twice (by one name or two): it would count twice in the mean."""
    seen: dict[tuple[int, int], str] = {}
    for path in paths:
        try:
            found = os.stat(path)
        except OSError:  # read_checkpoint names what is wrong with it
            continue
        key = (found.st_dev, found.st_ino)
        if key in seen:
            also = "" if seen[key] == path else f" (also as {seen[key]})"
            raise UserError(f"{path} is given twice{also}: each checkpoint counts once in the mean")
        seen[key] = path


def tied_groups(state_dict: dict[str, Any]) -> dict[str, list[str]]:
    """The state dict's names grouped by the tensor they share (tied embeddings): first name -> all."""
    groups: dict[tuple, list[str]] = {}
    for name, value in state_dict.items():
        key = (
            value.untyped_storage().data_ptr(),
            value.storage_offset(),
            value.shape,
            value.stride(),
        )
        groups.setdefault(key, []).append(name)
    return {names[0]: names for names in groups.values()}


def check_same_run(name_a: str, a: dict[str, Any], name_b: str, b: dict[str, Any]) -> None:
    """Refuse checkpoints whose model or tokenizer differ, naming the first difference."""
    args_a, args_b = complete_args(a["model_args"]), complete_args(b["model_args"])
    for key in sorted(set(args_a) | set(args_b)):
        if args_a.get(key) != args_b.get(key):
            raise UserError(
                f"{name_a} and {name_b} hold different models "
                f"({key}: {args_a.get(key)!r} vs {args_b.get(key)!r}); refusing to average them"
            )
    if a["tokenizer"] != b["tokenizer"]:
        raise UserError(
            f"{name_a} and {name_b} carry different tokenizers; refusing to average them"
        )
    shapes_a = {k: tuple(v.shape) for k, v in a["state_dict"].items()}
    shapes_b = {k: tuple(v.shape) for k, v in b["state_dict"].items()}
    if shapes_a != shapes_b or tied_groups(a["state_dict"]) != tied_groups(b["state_dict"]):
        raise UserError(
            f"{name_a} and {name_b} hold different parameters; refusing to average them"
        )
