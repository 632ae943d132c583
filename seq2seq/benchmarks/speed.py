"""Training and decoding speed: the fast path against the textbook reference, side by side.

    python scripts/benchmark.py [--quick] [--device cpu|cuda|auto] [--json FILE] [train.py flags]

Each path (PATHS) trains a model of the same initial weights on batches collated before the clock.
A round times an n x n matmul and a window of every path; ratios are medians over rounds of two
paths' tokens/s in one round; FLOPs are the model's `flops_per_token`. Decoding: greedy and beam-5
on the validation sources. Last, the whole run those figures imply for train.py's flags (its updates,
validations, checkpoints, preparation and scoring, each phase timed once here: wholerun.py), a row per
path beside its per-update figure. Memory and the heatmap callback: scripts/benchmark_memory.py.

Two baselines: `reference` writes the `bahdanau` GRU's loss out step by step (reference.py) on
fixed-size random batches, the textbook path; `plain` trains the model as seq2seq.models writes it,
no kernel plugged in, on the fast path's batches, for any model and decoder: fast against plain is
what seq2seq.models.kernels buy.

The header names the CPU (its model, `torch.backends.cpu.get_cpu_capability()`, and whether oneDNN
has native bf16). On a CPU without native bf16, autocast emulates bf16 arithmetic and is far slower
than fp32, so the bf16 path is skipped there (a row says why) unless `--force-bf16`. One line per
round goes to stderr while it runs.
"""

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from itertools import cycle
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader

from seq2seq.atomic import atomic_write_text, check_writable_file
from seq2seq.benchmarks.reference import reference_loss
from seq2seq.benchmarks.wholerun import (
    PhaseTimes,
    render_whole,
    run_shape,
    time_checkpoint,
    whole_runs,
)
from seq2seq.cli import Parser, cli_message, count
from seq2seq.data.batching import collate
from seq2seq.decoding.flags import pick_device
from seq2seq.errors import UserError
from seq2seq.machine import cpu_info
from seq2seq.models.build import build_model, model_args_from
from seq2seq.models.kernels import accelerate
from seq2seq.training.config import TrainConfig, parse_args
from seq2seq.training.losses import batch_loss
from seq2seq.training.system import adam

MATMUL = {"cpu": 1024, "cuda": 8192}  # n: 1024 keeps CPU cores busy; a big GPU needs 8192


@dataclass(frozen=True)
class Recipe:
    """A path: its loss, bf16 autocast or not, updates a window (x --steps), its batches, and what
    the loss calls instead of the model (a compiling wrapper; Adam keeps the model's weights)."""

    loss: Callable
    bf16: bool = False
    share: float = 1.0
    textbook: bool = False  # fixed-size random batches instead of token-budget ones (GRU only)
    prepare: Callable[[nn.Module], nn.Module] = accelerate  # the model's kernels plugged in
    compiles: bool = False  # `prepare` compiles the decoder loops (the GRU's alone)

    @property
    def for_gru_only(self) -> bool:
        return self.compiles or self.textbook


def compiled(model: nn.Module) -> nn.Module:
    """The GRU with its kernels and its decoder loops compiled by inductor (train.py --compile)."""
    return accelerate(model, compile=True)


def textbook(model: nn.Module) -> nn.Module:
    """The model as seq2seq.models writes it, no kernels: what `reference_loss` specifies, and what
    the `plain` path trains on the fast path's batches (fast against plain: what the kernels buy)."""
    return model


def textbook_loader(dataset, batch_size: int, max_len: int, seed: int = 1) -> DataLoader:
    """Random batches of `batch_size` pairs of a tokenized split, padded to their longest sentence.

    `dataset` has columns src_ids, tgt_ids, index, src_len, tgt_len (TranslationDataModule.datasets);
    pairs longer than `max_len` subwords are left out, as the bucketed loader does.
    """
    longer = np.maximum(np.asarray(dataset["src_len"][:]), np.asarray(dataset["tgt_len"][:]))
    rows = np.flatnonzero(longer <= max_len)
    data = dataset.select_columns(["src_ids", "tgt_ids", "index"]).select(rows)
    gen = torch.Generator().manual_seed(seed)
    return DataLoader(data, batch_size, shuffle=True, collate_fn=collate, generator=gen)


PATHS = {  # one row of the table each; the reference is ~4x slower per update
    "fast": Recipe(batch_loss),
    "bf16": Recipe(batch_loss, bf16=True),
    "compiled": Recipe(batch_loss, prepare=compiled, compiles=True),
    "compiled-bf16": Recipe(batch_loss, bf16=True, prepare=compiled, compiles=True),
    "plain": Recipe(batch_loss, share=0.5, prepare=textbook),  # no kernels; any model, any decoder
    "reference": Recipe(reference_loss, share=0.25, textbook=True, prepare=textbook),
}


COLUMNS = [("tokens/s", "tokens_per_sec", 0), ("vs reference", "vs_reference", 2, "x"),  # header,
           ("vs plain", "vs_plain", 2, "x"), ("% of matmul", "matmul_pct", 0),  # figure, decimals,
           ("s/update", "sec_per_update", 3), ("warm-up s", "warmup_sec", 1),  # suffix
           ("peak GPU MB", "peak_gpu_mb", 0)]  # fmt: skip


def path_names(
    device: torch.device, cpu: dict, force_bf16: bool, wanted: list[str] | None = None
) -> tuple[list[str], dict]:
    """The PATHS to run on `device` (of `wanted`, default all), and those skipped with the reason."""
    wanted = list(PATHS) if wanted is None else [k for k in PATHS if k in wanted]
    if device.type != "cpu" or cpu["native_bf16"] or force_bf16:
        return wanted, {}
    reason = (
        f"skipped: no native bf16 on this CPU ({cpu['capability']}), so autocast would emulate it; "
        "--force-bf16 runs it"
    )
    return [k for k in wanted if not PATHS[k].bf16], {k: reason for k in wanted if PATHS[k].bf16}


def progress(message: str) -> None:
    """A line on stderr at once: a full run takes many minutes, and stdout keeps only the table."""
    print(message, file=sys.stderr, flush=True)


def clock(device: torch.device) -> float:
    """time.perf_counter() once the device has done its queued work (CUDA runs asynchronously)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


class Path:
    """A recipe at work: model, Adam, batches (tokens and FLOPs counted up front: no sync)."""

    def __init__(self, recipe: Recipe, model_args: dict, batches: list, cfg: TrainConfig) -> None:
        self.recipe, self.cfg, self.device = recipe, cfg, batches[0]["src"].device
        torch.manual_seed(cfg.seed)  # every path starts from the same weights
        model = build_model(model_args).to(self.device).train()
        self.model, self.net, fpt = model, recipe.prepare(model), model.flops_per_token
        lens = [(b, b["src_lens"].double(), b["tgt_mask"].sum(1).double()) for b in batches]
        self.all = [(b, float(t.sum()), float((fpt(s, t) * t).sum())) for b, s, t in lens]
        self.batches, self.updates = cycle(self.all), 0
        self.opt = adam(model.parameters(), cfg.lr)  # training's, for every path

    def step(self, batch: dict[str, Tensor]) -> None:
        with torch.autocast(self.device.type, torch.bfloat16, enabled=self.recipe.bf16):
            loss_sum, _, tokens = self.recipe.loss(self.net, batch, self.cfg.label_smoothing)[:3]
        self.opt.zero_grad(set_to_none=True)
        (loss_sum / tokens).backward()
        if self.cfg.clip_norm > 0:
            nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.clip_norm)
        self.opt.step()
        self.updates += 1

    def window(self, steps: int) -> dict[str, float]:
        if self.device.type == "cuda":  # this path's peak, over every path's resident models
            torch.cuda.reset_peak_memory_stats(self.device)
        start, tokens, flops = clock(self.device), 0.0, 0.0
        for _ in range(steps):
            batch, n, f = next(self.batches)
            self.step(batch)
            tokens, flops = tokens + n, flops + f
        w = {"sec": clock(self.device) - start, "tokens": tokens, "flops": flops, "steps": steps}
        if self.device.type == "cuda":
            w["peak_gpu_mb"] = torch.cuda.max_memory_allocated(self.device) / 2**20
        return w


def matmul_rates(device: torch.device, reps: int = 8) -> dict[str, float]:
    """GFLOP/s of an n x n matmul (MATMUL) after a warm-up: fp32, and on CUDA bf16 too."""
    n, rates = MATMUL[device.type], {}
    for name, dtype in [("fp32", torch.float32), ("bf16", torch.bfloat16)][: 1 + (n > 1024)]:
        a = torch.randn(n, n, device=device, dtype=dtype)  # (n, n)
        torch.mm(a, a)
        start = clock(device)
        for _ in range(reps):
            torch.mm(a, a)
        rates[name] = reps * 2 * n**3 / (clock(device) - start) / 1e9
    return rates


def make_paths(cfg: TrainConfig, names: list[str], device: torch.device) -> tuple:
    """The data module, the model's arguments and the paths `names` on `device`, set up."""
    from seq2seq.data.datamodule import TranslationDataModule

    dm = TranslationDataModule(cfg, positions=cfg.positions)
    dm.prepare_data()
    dm.setup("fit")
    model_args, train = model_args_from(cfg, dm.vocab_size), dm.datasets["train"]
    on = lambda batches: [{k: v.to(device) for k, v in b.items()} for b in batches]  # noqa: E731
    fast = on(dm.train_dataloader())
    size = max(1, round(len(train) / len(fast)))  # textbook batches: as many per epoch
    # The GRU's paths; the reference (`reference_loss`) writes out the `bahdanau` decoder alone.
    names = [k for k in names if cfg.model == "rnn" or not PATHS[k].for_gru_only]
    names = [k for k in names if cfg.decoder == "bahdanau" or not PATHS[k].textbook]
    needed = any(PATHS[k].textbook for k in names)
    textbook = on(textbook_loader(train, size, cfg.max_len, cfg.seed)) if needed else []
    paths = {k: Path(PATHS[k], model_args, textbook if PATHS[k].textbook else fast, cfg)
             for k in names}  # fmt: skip
    return dm, model_args, paths


def decode_speed(translator, sources: list[str], refs: list[str], rounds: int) -> dict:
    """Greedy and beam-5 sentences/s (medians over rounds, the two interleaved) and their BLEU."""
    from seq2seq.decoding.metrics import corpus_bleu

    out, times = {"sentences": len(sources)}, {"greedy": [], "beam5": []}
    for _ in range(rounds):
        for name, beam in (("greedy", 1), ("beam5", 5)):
            start = clock(translator.device)
            hyps = translator.translate(sources, beam=beam)
            times[name].append(clock(translator.device) - start)
            out[f"{name}_bleu"] = corpus_bleu([h.text for h in hyps], refs).value
    speed = {f"{k}_sent_per_sec": len(sources) / statistics.median(v) for k, v in times.items()}
    return out | speed


def figures(name: str, rounds: list[dict]) -> dict:
    """Medians over rounds; % of the round's matmul rate (a bf16 path's: of bf16's, where known)."""
    of = "bf16" if PATHS[name].bf16 and "bf16" in rounds[0]["matmul"] else "fp32"
    med = lambda f: statistics.median(map(f, rounds))  # noqa: E731
    speed = lambda r, k=name: r[k]["tokens"] / r[k]["sec"]  # noqa: E731
    ref, plain = "reference" in rounds[0], "plain" in rounds[0]
    return {
        "tokens_per_sec": med(speed),
        "sec_per_update": med(lambda r: r[name]["sec"] / r[name]["steps"]),
        "matmul_pct": med(lambda r: r[name]["flops"] / r[name]["sec"] / 1e7 / r["matmul"][of]),
        "peak_gpu_mb": max(r[name].get("peak_gpu_mb", 0) for r in rounds) or None,
        "vs_reference": med(lambda r: speed(r) / speed(r, "reference")) if ref else None,
        "vs_plain": med(lambda r: speed(r) / speed(r, "plain")) if plain else None,
    }


def decoding(args: argparse.Namespace, dm: Any, fast: Path, device: torch.device) -> dict:
    """Decoding speed, measured before any path's windows: as in a process that translates only.

    After the textbook path's windows an older search ran 1.5x as fast as in a fresh process, which
    is not what evaluate.py, translate.py or the server meet (docs/results/benchmarks.md).
    """
    from seq2seq.decoding.translator import Translator

    if not args.checkpoint and fast.updates < args.train_updates:
        progress(f"training the fast model to {args.train_updates} updates, then decoding")
    while not args.checkpoint and fast.updates < args.train_updates:
        fast.step(next(fast.batches)[0])
    load = args.checkpoint and Translator.load(args.checkpoint, device)
    translator = load or Translator(fast.model, dm.tokenizer, device)  # eval mode while decoding
    n = 100 if args.quick else None  # validation sentences decoded
    sources, refs = dm.sources("val")[:n], dm.references("val")[:n]
    progress(f"decoding {len(sources):,} validation sentences, greedy and beam 5")
    speed = decode_speed(translator, sources, refs, 1 if args.quick else 2)
    fast.model.train()  # the windows train it on
    return speed | {"trained_updates": fast.updates}


def run(args: argparse.Namespace, cfg: TrainConfig, device: torch.device) -> dict:
    from seq2seq.data.prepare import prepare

    started, cpu = time.perf_counter(), cpu_info()
    names, skipped = path_names(device, cpu, args.force_bf16, args.paths)
    progress(f"cpu: {describe_cpu(cpu)}; paths: {', '.join(names)}")
    built = prepare(cfg).built  # timed apart: a whole run's first phase (cold, or a cache read)
    prepare_sec = time.perf_counter() - started
    dm, model_args, paths = make_paths(cfg, names, device)
    decode = decoding(args, dm, paths["fast"], device)
    # Warm-up (allocator, Adam state, a compiler if any), timed: a compiled path's compile time.
    warmup = {k: p.window(1)["sec"] for k, p in paths.items()}
    rounds = []
    for r in range(args.windows):  # the order alternates, so drift hits every path alike
        order = list(paths.items())[:: 1 if r % 2 == 0 else -1]
        rates = matmul_rates(device)
        windows = {k: p.window(max(1, round(args.steps * p.recipe.share))) for k, p in order}
        rounds.append({"matmul": rates, **windows})
        speeds = ", ".join(f"{k} {w['tokens'] / w['sec']:,.0f}" for k, w in windows.items())
        elapsed = time.perf_counter() - started
        progress(f"round {r + 1}/{args.windows}: tokens/s {speeds}; {elapsed:.0f} s so far")
    fast = paths["fast"]
    phases = PhaseTimes(prepare_sec, built, time_checkpoint(fast.model, fast.opt))
    shape = run_shape(
        len(fast.all), cfg.max_epochs, cfg.max_steps, cfg.val_every, cfg.accumulate_grad_batches,
        len(dm.sources("val")), len(dm.sources("test")) if "test" in dm.datasets else 0,
    )  # fmt: skip
    figs = {k: figures(k, rounds) | {"warmup_sec": warmup[k]} for k in paths}
    per_update = {k: f["sec_per_update"] for k, f in figs.items() if not PATHS[k].textbook}
    return {
        "cpu": cpu,
        "skipped": skipped,
        "model_args": model_args,
        "data": {"dataset": cfg.data_dir or cfg.dataset, "batch_tokens": cfg.batch_tokens},
        "run": {k: getattr(args, k) for k in ("steps", "windows", "quick", "checkpoint")},
        "threads": torch.get_num_threads(),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "mflop_per_token": sum(f for *_, f in fast.all) / sum(t for _, t, _ in fast.all) / 1e6,
        "matmul": {k: statistics.median(r["matmul"][k] for r in rounds) for k in rates},
        "matmul_n": MATMUL[device.type],
        "paths": figs,
        "rounds": rounds,
        "decode": decode,
        "whole_run": whole_runs(shape, phases, per_update, decode),
        "wall_sec": time.perf_counter() - started,
        "loadavg_1min": os.getloadavg()[0],
    }  # fmt: skip


def describe_cpu(cpu: dict) -> str:
    bf16 = "native bf16" if cpu["native_bf16"] else "no native bf16"
    return f"{cpu['model']}, capability {cpu['capability']}, {bf16}"


def render(r: dict) -> str:
    """The printed table: what ran, one row per path, the matmul rate, decoding."""
    g = lambda x, p=0, s="": "-" if x is None else f"{x:,.{p}f}{s}"  # noqa: E731
    m, d, paths = r["model_args"], r["decode"], r["paths"].values()
    cols = [c for c in COLUMNS if any(f[c[1]] is not None for f in paths)]  # peak GPU: CUDA only
    rows = [["path", *(head for head, *_ in cols)]]
    rows += [[k, *(g(f[key], *fmt) for _, key, *fmt in cols)] for k, f in r["paths"].items()]
    w = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    w[0] = max([w[0], *map(len, r.get("skipped", {}))])  # a skipped path's name lines up too
    skipped = [f"{k.ljust(w[0])}  {why}" for k, why in r.get("skipped", {}).items()]
    sizes = ", ".join(f"{k} {v}" for k, v in m.items() if k != "model" and v is not None)
    rates = ", ".join(f"{k} {v:,.0f}" for k, v in r["matmul"].items())
    n, model = r["matmul_n"], r["run"]["checkpoint"] or f"{d['trained_updates']} updates"
    return "\n".join([
        f"{m['model']} ({sizes}); {r['data']['dataset']}, {r['data']['batch_tokens']:,}-token "
        f"batches; {r['device']}, {r['threads']} threads, torch {torch.__version__}",
        f"cpu: {describe_cpu(r['cpu'])}",
        *["  ".join([row[0].ljust(w[0]), *map(str.rjust, row[1:], w[1:])]) for row in rows],
        *skipped,
        f"{len(r['rounds'])} rounds of {r['run']['steps']} fast updates; load "
        f"{r['loadavg_1min']:.2f}; {n}x{n} matmul GFLOP/s: {rates}; {r['mflop_per_token']:.1f} "
        "MFLOP per target token (forward + backward)",
        f"decoding {d['sentences']:,} val sentences ({model}): greedy "
        f"{d['greedy_sent_per_sec']:,.0f}, beam-5 {d['beam5_sent_per_sec']:,.0f} sentences/s; "
        f"BLEU {d['greedy_bleu']:.1f}, {d['beam5_bleu']:.1f}",
        *(render_whole(r["whole_run"]) if "whole_run" in r else []),
    ])  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    quick = "--quick" in (sys.argv[1:] if argv is None else argv)  # it sets the defaults below
    p = Parser(description=__doc__.split("\n")[0], epilog="Others: train.py's.")
    p.add_argument("--quick", action="store_true", help="a short, noisy run of every figure")
    p.add_argument("--steps", type=count, default=2 if quick else 10, help="fast updates a window")
    p.add_argument("--windows", type=count, default=3 if quick else 8, help="rounds of windows")
    p.add_argument("--train-updates", type=count, default=20 if quick else 300, help="then decode")
    p.add_argument("--checkpoint", help="decode with this checkpoint instead")
    p.add_argument("--device", default="cpu", help="cpu, cuda, auto (cuda when there is one)")
    p.add_argument("--json", metavar="FILE", help="also write every figure here")
    p.add_argument(
        "--paths", nargs="+", choices=list(PATHS), default=list(PATHS), metavar="PATH",
        help=f"the paths to time, `fast` among them: {', '.join(PATHS)} (default: all)",
    )  # fmt: skip
    p.add_argument(
        "--force-bf16", action="store_true", help="time bf16 on a CPU without native bf16 too"
    )
    args, rest = p.parse_known_args(argv)
    if "fast" not in args.paths:
        p.error("--paths must include fast: decoding and every ratio are measured against it")
    try:
        if args.json:  # refused now, not after the minutes of the run
            check_writable_file(args.json, f"--json {args.json}")
        cfg, device = parse_args(rest), pick_device(args.device)
        result = run(args, cfg, device)
    except UserError as err:
        print(f"error: {cli_message(err)}", file=sys.stderr)
        return 2
    if args.json:  # before the table: the figures are kept even if printing them fails
        atomic_write_text(args.json, json.dumps(result, indent=2))  # whole or not at all
    print(render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
