"""Peak memory and the heatmap callback's cost: a probe, and real short runs of scripts/train.py.

    python scripts/benchmark_memory.py [--quick] [--updates N] [--json FILE] [train.py flags]

probe: per path of benchmark.py, a child trains on an epoch's heaviest batches (B x S x T); peak RSS
from after setup. train: train.py itself in a child, `--updates` updates in fp32 and bf16-mixed,
validating twice, heatmaps every updates/4; a callback reads VmRSS every `--every` updates; the peak
is VmHWM at exit. heatmaps: the AttentionHeatmaps hooks timed in those runs; their share of the run,
and at the defaults (an epoch of U updates: U/500 teacher-forced draws, a validation's greedy draw).
On a CPU without native bf16 the bf16 probe and run are skipped, as benchmark.py skips its bf16
path, unless --force-bf16.
"""

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch

from seq2seq.atomic import atomic_write_text, check_writable_file
from seq2seq.benchmarks import speed
from seq2seq.cli import Parser, cli_message, count
from seq2seq.decoding.flags import pick_device
from seq2seq.errors import UserError
from seq2seq.machine import cpu_info
from seq2seq.study.process import package_env
from seq2seq.training.config import TrainConfig, parse_args

PRECISIONS = ("32-true", "bf16-mixed")
# The AttentionHeatmaps hooks, timed, and what each draws; on_train_batch_end draws every N updates.
HOOKS = {"on_fit_start": "setup", "on_train_start": "teacher-forced",
         "on_train_batch_end": "teacher-forced", "on_validation_end": "greedy"}  # fmt: skip


def status_mb(field: str) -> float | None:
    """VmRSS (resident now) or VmHWM (the high-water mark) of this process, MB; None off Linux."""
    with contextlib.suppress(OSError, StopIteration), open("/proc/self/status") as status:
        return next(int(line.split()[1]) / 1024 for line in status if line.startswith(field))
    return None


def probe(name: str, cfg: TrainConfig, device: torch.device, heaviest: int) -> dict:
    """Child: train path `name` on the epoch's heaviest batches; its peak RSS after setup."""
    bench = speed
    _, _, paths = bench.make_paths(cfg, [name], device)
    path = paths[name]
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # resets the high-water mark: what setup built and freed does not count
    before = status_mb("VmRSS")
    weight = lambda b: b["tgt_in"].numel() * b["src"].size(1)  # noqa: E731
    for batch in sorted((b for b, *_ in path.all), key=weight)[-heaviest:]:
        path.step(batch)
    gpu = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
    return {"peak_rss_mb": status_mb("VmHWM"), "rss_before_mb": before, "peak_gpu_mb": gpu}


def train_child(log: str, every: int, argv: list[str]) -> int:
    """Child: `seq2seq train`'s main with an observer added to its trainer, which writes to `log`."""
    import lightning as L

    from seq2seq.commands import train
    from seq2seq.training import run
    from seq2seq.training.callbacks import AttentionHeatmaps

    class Observer(L.Callback):
        """VmRSS every `every` updates, fit and validation seconds, the heatmap hooks' seconds."""

        def __init__(self) -> None:
            self.seen: dict = {"rss": [], "draws": [], "val_sec": []}

        def timed(self, hook: Callable, kind: str, every_n: int) -> Callable:
            def call(trainer: L.Trainer, *args) -> None:
                start, step = time.perf_counter(), trainer.global_step
                hook(trainer, *args)
                drew = kind != "teacher-forced" or step % every_n == 0
                self.seen["draws"].append((kind if drew else "check", time.perf_counter() - start))

            return call

        def on_fit_start(self, *args) -> None:  # before any on_train_start: the first draw counts
            self.start = time.perf_counter()

        def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
            self.seen["batches"] = trainer.num_training_batches
            self.on_train_batch_end(trainer)

        def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
            if trainer.global_step % every == 0:
                self.seen["rss"].append({"update": trainer.global_step, "mb": status_mb("VmRSS")})

        def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
            self.seen["val_sec"].append(-time.perf_counter())

        def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
            self.seen["val_sec"][-1] += time.perf_counter()  # after the heatmaps' greedy draw

        def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
            self.seen.update(fit_sec=time.perf_counter() - self.start, updates=trainer.global_step)

    observer = Observer()
    build = run.build_trainer

    def build_trainer(cfg: TrainConfig, callbacks: list, logger) -> L.Trainer:
        for cb in callbacks:
            if isinstance(cb, AttentionHeatmaps):
                for hook, kind in HOOKS.items():
                    setattr(cb, hook, observer.timed(getattr(cb, hook), kind, cb.every_n_steps))
        return build(cfg, [*callbacks, observer], logger)

    run.build_trainer = build_trainer  # train() looks it up in its module when it runs
    code = train.main(argv)
    gpu = torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_initialized() else None
    seen = observer.seen | {"peak_rss_mb": status_mb("VmHWM"), "peak_gpu_mb": gpu, "code": code}
    Path(log).write_text(json.dumps(seen))
    return code


def heatmap_cost(run: dict, every_default: int) -> dict:
    """The callback's seconds in the run, its share of it, and its share at the default settings."""
    draws = {
        k: [sec for kind, sec in run["draws"] if kind == k] for k in (*HOOKS.values(), "check")
    }
    tf, greedy = draws["teacher-forced"], draws["greedy"]
    redraw = statistics.median(tf[1:] or tf)  # the first draw builds the figures, once a run
    val = statistics.mean(run["val_sec"]) - statistics.mean(greedy)  # a validation without it
    update = (run["fit_sec"] - sum(run["val_sec"]) - sum(tf)) / run["updates"]
    epoch = run["batches"] / every_default * redraw + statistics.mean(greedy)  # its cost an epoch
    return {
        "share_of_run": sum(map(sum, draws.values())) / run["fit_sec"],
        "teacher_forced_sec": redraw,
        "first_teacher_forced_sec": tf[0],
        "greedy_sec": statistics.mean(greedy),
        "sec_per_update": update,
        "validation_sec": val,
        "share_at_defaults": epoch / (run["batches"] * update + val + epoch),
    }


def spawn(cmd: list[str], log: Path) -> subprocess.Popen:
    """Start a child with its output in `log` (a pipe could fill up and stall it)."""
    with open(log, "w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "seq2seq.benchmarks.memory", *cmd],
            stdout=out,
            stderr=out,
            env=package_env(),
        )


def output(proc: subprocess.Popen, log: Path) -> str:
    """Wait for a child: the last line of its output, or a RuntimeError with the output's tail."""
    if proc.wait() != 0:
        raise RuntimeError(f"a child failed ({proc.returncode}):\n{log.read_text()[-3000:]}")
    return (log.read_text().strip().splitlines() or [""])[-1]


def plan(
    bench: ModuleType, device: torch.device, cpu: dict | None, precisions: list[str], force: bool
) -> tuple[list[str], list[str], dict[str, str]]:
    """benchmark.py's rule for the probes' paths and the train runs' precisions: on a CPU without
    native bf16 neither runs bf16 (autocast would emulate it, 14x slower) unless `force`; the
    skipped ones with the reason."""
    names, skipped = bench.path_names(device, cpu, force) if cpu else (list(bench.PATHS), {})
    kept = [p for p in precisions if not (skipped and p.startswith("bf16"))]
    skipped |= {p: next(iter(skipped.values())) for p in precisions if p not in kept}
    return names, kept, skipped


def run(args: argparse.Namespace, rest: list[str], cfg: TrainConfig, device: torch.device) -> dict:
    bench, started = speed, time.perf_counter()
    cpu = cpu_info() if device.type == "cpu" else None
    names, precisions, skipped = plan(bench, device, cpu, args.precisions, args.force_bf16)
    names = [k for k in names if cfg.model == "rnn" or not bench.PATHS[k].for_gru_only]
    # A compiled path's probe would time the compiler's own memory, not training's: eager paths only.
    names = [k for k in names if not bench.PATHS[k].compiles]
    out: dict = {"updates": args.updates, "every": args.every, "cpu": cpu, "skipped": skipped}
    out |= {"probe": {}, "train": {}}
    with tempfile.TemporaryDirectory() as tmp:
        # The probes run at once, one thread each: their peak memory does not depend on speed.
        flags = [f"--device={args.device}", "--threads=1", f"--heaviest={3 - 2 * args.quick}"]
        logs = {k: Path(tmp, f"probe-{k}.log") for k in names}
        procs = {k: spawn(["--probe", k, *flags, *rest], logs[k]) for k in names}
        out["probe"] = {k: json.loads(output(procs[k], logs[k])) for k in names}
        accelerator, runs = "gpu" if args.device.startswith("cuda") else args.device, tmp + "/runs"
        for precision in precisions:  # one after the other: each has the machine to itself
            seen, log = Path(tmp, f"{precision}.json"), Path(tmp, f"{precision}.log")
            flags = [f"--max-steps={args.updates}", f"--precision={precision}", "--devices=1",
                     f"--val-every={max(1, args.updates // 2)}", f"--accelerator={accelerator}",
                     f"--heatmap-every={max(1, args.updates // 4)}", "--log-dir", runs]  # fmt: skip
            child = ["--train-child", str(seen), f"--every={args.every}", *rest, *flags]
            output(spawn(child, log), log)
            result = json.loads(seen.read_text())
            result["heatmaps"] = heatmap_cost(result, TrainConfig.heatmap_every)
            out["train"][precision] = result
    out.update(wall_sec=time.perf_counter() - started, loadavg_1min=os.getloadavg()[0])
    return out


def render(r: dict) -> str:
    """The printed table: probe peaks per path, then the two training runs side by side."""
    g = lambda x, p=0, s="": "-" if x is None else f"{x:,.{p}f}{s}"  # noqa: E731
    row = lambda label, xs, p=0, s="": [label, *(g(x, p, s) for x in xs)]  # noqa: E731
    probe, train = r["probe"].values(), r["train"].values()
    heat, first = [t["heatmaps"] for t in train], next(iter(train))
    rows = [
        ["probe: heaviest batches", *r["probe"]],
        row("peak RSS, MB", (p["peak_rss_mb"] for p in probe)),
        row("RSS before training, MB", (p["rss_before_mb"] for p in probe)),
        [f"train.py, {r['updates']} updates", *r["train"]],
        *[row(f"RSS at update {s['update']}, MB", (t["rss"][i]["mb"] for t in train))
          for i, s in enumerate(first["rss"])],
        row("peak RSS (VmHWM), MB", (t["peak_rss_mb"] for t in train)),
        row("s/update (no heatmaps, validation)", (h["sec_per_update"] for h in heat), 3),
        row("validation, s", (h["validation_sec"] for h in heat), 1),
        row("heatmaps teacher-forced, s a draw", (h["teacher_forced_sec"] for h in heat), 3),
        row("heatmaps greedy, s a validation", (h["greedy_sec"] for h in heat), 3),
        row("heatmaps, share of this run", (100 * h["share_of_run"] for h in heat), 2, "%"),
        row("heatmaps, share at defaults", (100 * h["share_at_defaults"] for h in heat), 2, "%"),
    ]  # fmt: skip
    if first["peak_gpu_mb"] is not None:
        rows.append(row("peak GPU memory, MB", (t["peak_gpu_mb"] for t in train)))
    w = [max(len(row[i]) for row in rows if len(row) > i) for i in range(max(map(len, rows)))]
    lines = ["  ".join([row[0].ljust(w[0]), *map(str.rjust, row[1:], w[1:])]) for row in rows]
    cpu = [f"cpu: {speed.describe_cpu(r['cpu'])}"] if r.get("cpu") else []
    skipped = [f"{k}: {why}" for k, why in r.get("skipped", {}).items()]
    load = f"load {r['loadavg_1min']:.2f}; {r['wall_sec']:.0f} s in all"
    return "\n".join([*cpu, *lines, *skipped, load])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    quick = "--quick" in argv
    p = Parser(description=__doc__.split("\n")[0], epilog="Others: train.py's.")
    p.add_argument("--quick", action="store_true", help="short runs: every figure, noisy")
    p.add_argument("--updates", type=count, default=20 if quick else 200, help="of each train run")
    p.add_argument(
        "--precisions", nargs="+", default=PRECISIONS, metavar="P", help="of the train runs"
    )
    p.add_argument(
        "--force-bf16", action="store_true", help="bf16 on a CPU without native bf16 too"
    )
    p.add_argument("--every", type=count, help="read RSS every N updates (default: updates / 4)")
    p.add_argument("--threads", type=int, default=torch.get_num_threads(), help=argparse.SUPPRESS)
    p.add_argument("--device", default="cpu", help="cpu or cuda (train.py: --accelerator gpu)")
    p.add_argument("--json", metavar="FILE", help="also write every figure here")
    p.add_argument("--probe", help=argparse.SUPPRESS)  # the children's flags
    p.add_argument("--heaviest", type=int, default=3, help=argparse.SUPPRESS)
    p.add_argument("--train-child", help=argparse.SUPPRESS)
    args, rest = p.parse_known_args(argv)
    args.every = args.every or max(1, args.updates // 4)
    if args.train_child:
        return train_child(args.train_child, args.every, rest)
    try:
        if args.json:  # refused now, not after the minutes of the runs
            check_writable_file(args.json, f"--json {args.json}")
        cfg, device = parse_args(rest), pick_device(args.device)
        torch.set_num_threads(args.threads)
        if args.probe:
            print(json.dumps(probe(args.probe, cfg, device, args.heaviest)))
            return 0
        result = run(args, rest, cfg, device)
    except UserError as err:
        print(f"error: {cli_message(err)}", file=sys.stderr)
        return 2
    if args.json:
        atomic_write_text(args.json, json.dumps(result, indent=2))  # whole or not at all
    print(render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
