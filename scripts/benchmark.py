"""Training and decoding speed of the fast path beside the textbook reference, side by side in one run.

    python scripts/benchmark.py [--quick] [--json benchmark.json]

Training: windows of fast updates (`batch_loss` on length-bucketed token-budget batches) alternate with
windows of reference updates (`seq2seq.reference`: keys and output layer per step, random batches of a
fixed size padded to their longest sentence, as many batches per epoch) and bursts of a 1024x1024 fp32
matmul; each figure is the median over windows. An update is forward, backward, gradient clipping and
an Adam step; both paths' batches are collated before the clock starts. Useful FLOPs are counted from the matmul shapes on real tokens only
(padding is not useful work): 2 per multiply-add, backward = 2x forward. Peak memory is the RSS
high-water mark of a child process that loads the data, builds the model and runs the heaviest
batches of an epoch for that path (the mark is reset after setup, so a first run's tokenizer training
does not count). Decoding times the fast model (trained here for
`--train-updates`, or loaded from `--checkpoint`) on the validation sentences; the heatmap callback's
overhead is one call / (its default every-N x seconds per update).
"""

import argparse
import copy
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from itertools import cycle
from types import SimpleNamespace

import torch

from seq2seq.config import TrainConfig, validate
from seq2seq.errors import UserError

SIZES = ("emb_size", "hidden_size", "d_model", "heads", "layers", "ff_size", "vocab_size",
         "batch_tokens")  # fmt: skip
REPORTED = ("model", "score", *SIZES, "threads", "steps", "windows", "train_updates", "quick")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    d = TrainConfig()
    p = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--model", choices=("rnn", "transformer"), default=d.model)
    p.add_argument("--score", choices=("additive", "dot", "scaled"), default=d.score)
    for name in SIZES:
        p.add_argument("--" + name.replace("_", "-"), type=int, default=getattr(d, name))
    p.add_argument("--dataset", default=d.dataset)
    p.add_argument("--data-dir", help="folder of <split>.<lang> files (overrides --dataset)")
    p.add_argument(
        "--steps",
        type=int,
        help="fast updates per timing window (default 10; quick 2); "
        "the reference runs a fifth as many",
    )
    p.add_argument("--windows", type=int, help="timing windows per path (default 8; quick 3)")
    p.add_argument("--train-updates", type=int, help="fast updates before decoding (default 300)")
    p.add_argument("--checkpoint", help="decode with this trained checkpoint instead")
    p.add_argument(
        "--decode-sentences", type=int, help="validation sentences decoded (default all)"
    )
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument(
        "--quick", action="store_true", help="a small run (< 2 min): every figure, noisy"
    )
    p.add_argument("--json", metavar="FILE", help="also write the results here")
    p.add_argument("--memory-probe", choices=("fast", "bf16", "reference"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    quick = args.quick
    for name, full, small in [("steps", 10, 2), ("windows", 8, 3), ("train_updates", 300, 0),
                              ("decode_sentences", 0, 24)]:  # fmt: skip
        if getattr(args, name) is None:
            setattr(args, name, small if quick else full)
    return args


def config_of(args: argparse.Namespace) -> TrainConfig:
    keys = ("model", "score", *SIZES, "dataset")
    return validate(TrainConfig(**{k: getattr(args, k) for k in keys}, data_dir=args.data_dir))


def forward_flops(cfg: TrainConfig, vocab: int, batch: dict) -> float:
    """Matmul FLOPs of one forward pass over the batch's real tokens (2 per multiply-add)."""
    s = batch["src_lens"].double()  # (B,) source tokens per sentence, EOS included
    t = batch["tgt_mask"].sum(1).double()  # (B,)
    if cfg.model == "transformer":
        H, F, L = cfg.d_model, cfg.ff_size, cfg.layers
        enc = L * (s * (8 * H * H + 4 * H * F) + 4 * H * s * s)  # QKVO + FF; scores and context
        dec = L * (
            t * (12 * H * H + 4 * H * F) + 4 * H * H * s
        )  # self QKVO, cross QO, FF; cross KV
        dec = dec + L * 4 * H * (t * (t + 1) / 2 + t * s)  # causal self-attention; cross-attention
        return float((enc + dec + t * 2 * H * vocab).sum())
    E, H, A = cfg.emb_size, cfg.hidden_size, cfg.attn_size or cfg.hidden_size
    h, additive = H // 2, cfg.score == "additive"
    enc = sum(2 * 2 * 3 * h * ((E if i == 0 else H) + h) for i in range(cfg.enc_layers))
    enc += 2 * H * A if additive else 0  # keys projected once per sentence
    step = 2 * 3 * H * (E + H + H) + 2 * (2 * H + E) * E + 2 * E * vocab  # GRU, readout, generator
    step += 2 * H * A if additive else 0  # query projection
    attn = 2 * (A if additive else H) + 2 * H  # per (target, source) pair: scores and context
    return float((s * enc + t * step + t * s * attn + h * H * 2).sum())  # + the bridge


class Path:
    """One training path: its model copy, Adam, a batch stream and a loss."""

    def __init__(
        self, model, batches, loss, cfg: TrainConfig, vocab: int, bf16: bool = False
    ) -> None:
        self.model, self.all, self.batches, self.loss = model.train(), batches, cycle(batches), loss
        self.bf16 = bf16  # matmuls under bf16 autocast (what --precision bf16-mixed does)
        self.cfg, self.vocab, self.updates = cfg, vocab, 0
        self.opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, betas=(0.9, 0.98), eps=1e-9)
        self.windows: list[tuple[float, float, float, int]] = []  # seconds, tokens, FLOPs, steps

    def step(self, batch: dict) -> tuple[float, float]:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16):
            loss_sum, _, tokens = self.loss(self.model, batch, self.cfg.label_smoothing)[:3]
        self.opt.zero_grad(set_to_none=True)
        (loss_sum / tokens).backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.clip_norm)
        self.opt.step()
        self.updates += 1
        return float(tokens), 3 * forward_flops(self.cfg, self.vocab, batch)

    def window(self, steps: int, record: bool = True) -> None:
        start, tokens, flops = time.perf_counter(), 0.0, 0.0
        for _ in range(steps):
            n, f = self.step(next(self.batches))
            tokens, flops = tokens + n, flops + f
        if record:
            self.windows.append((time.perf_counter() - start, tokens, flops, steps))

    def figures(self, peak: float) -> dict:
        rate = statistics.median(n / s for s, n, _, _ in self.windows)
        gflops = statistics.median(f / s / 1e9 for s, _, f, _ in self.windows)
        return {
            "tokens_per_sec": rate,
            "sec_per_update": statistics.median(s / k for s, _, _, k in self.windows),
            "useful_gflops": gflops,
            "matmul_fraction": gflops / peak,
            "mflop_per_token": sum(w[2] for w in self.windows)
            / sum(w[1] for w in self.windows)
            / 1e6,
            "windows": [{"sec": s, "tokens": n, "steps": k} for s, n, _, k in self.windows],
        }


def matmul_burst(reps: int = 8, n: int = 1024) -> float:
    """GFLOP/s of an n x n fp32 matmul on the current threads."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    start = time.perf_counter()
    for _ in range(reps):
        torch.mm(a, b)
    return reps * 2 * n**3 / (time.perf_counter() - start) / 1e9


def setup(args: argparse.Namespace):
    from seq2seq.data import TranslationDataModule
    from seq2seq.models import build_model

    cfg = config_of(args)
    dm = TranslationDataModule(corpus=cfg.dataset, data_dir=cfg.data_dir, vocab_size=cfg.vocab_size,
                               batch_tokens=cfg.batch_tokens, max_len=cfg.max_len, seed=cfg.seed)  # fmt: skip
    dm.prepare_data()
    dm.setup("fit")
    torch.manual_seed(cfg.seed)
    return cfg, dm, build_model(cfg, dm.vocab_size)


def paths(cfg: TrainConfig, dm, model, which: tuple[str, ...]) -> dict[str, Path]:
    from seq2seq.reference import reference_loss, textbook_loader
    from seq2seq.system import batch_loss

    fast = list(dm.train_dataloader())
    out = {"fast": Path(model, fast, batch_loss, cfg, dm.vocab_size)}
    if "bf16" in which:
        out["bf16"] = Path(copy.deepcopy(model), fast, batch_loss, cfg, dm.vocab_size, bf16=True)
    if "reference" in which and cfg.model == "rnn":
        size = max(1, round(len(dm.datasets["train"]) / len(fast)))  # as many batches per epoch
        ref = list(textbook_loader(dm.datasets["train"], size, cfg.max_len, cfg.seed))
        out["reference"] = Path(copy.deepcopy(model), ref, reference_loss, cfg, dm.vocab_size)
    return out


def rss_mb(field: str = "VmHWM") -> float:
    """The process's peak (VmHWM) or current (VmRSS) resident set from /proc; ru_maxrss elsewhere."""
    try:
        with open("/proc/self/status") as status:
            return next(int(ln.split()[1]) / 1024 for ln in status if ln.startswith(field + ":"))
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


def memory_probe(args: argparse.Namespace) -> int:
    """Child process: train on the heaviest batches of an epoch of one path; print peak RSS as JSON.

    The high-water mark is reset after setup (Linux: /proc/self/clear_refs), so a tokenizer or cache
    built on a first run does not count; what stays resident from setup does.
    """
    cfg, dm, model = setup(args)
    path = paths(cfg, dm, model, (args.memory_probe,))[args.memory_probe]
    try:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")
    except OSError:
        pass  # the peak then includes setup
    before = rss_mb("VmRSS")
    # Activations grow with B * T * S (the additive energies of every step are kept for backward).
    heavy = sorted(path.all, key=lambda b: -b["tgt_in"].numel() * b["src"].size(1))
    for batch in heavy[: 1 if args.quick else 3]:
        path.step(batch)
    print(json.dumps({"peak_rss_mb": rss_mb(), "before_training_mb": before}))
    return 0


def peak_memory(
    argv: list[str], names: list[str], parallel: bool
) -> dict[str, tuple[float, float]]:
    """Per path, the peak RSS (MB) of a child process running its heaviest batches with the same flags,
    and its resident set before training. With `parallel` (--quick) the children run at once, one
    thread each, to save a process start-up."""
    extra = ["--threads", "1"] if parallel else []
    cmd = [sys.executable, __file__, *argv, *extra, "--memory-probe"]
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}

    def start(name: str) -> subprocess.Popen:
        return subprocess.Popen([*cmd, name], **pipes)

    procs = {n: start(n) for n in names} if parallel else {}
    out = {}
    for name in names:
        stdout, stderr = (procs.get(name) or start(name)).communicate()
        if not stdout.strip():
            raise RuntimeError(f"memory probe {name} failed:\n{stderr[-2000:]}")
        probe = json.loads(stdout.strip().splitlines()[-1])
        out[name] = probe["peak_rss_mb"], probe["before_training_mb"]
    return out


def decode_speed(model, tokenizer, dm, sentences: int, rounds: int) -> dict:
    """Greedy and beam-5 sentences/second on the validation sources, batched as evaluate.py does."""
    from seq2seq.data import source_loader
    from seq2seq.metrics import corpus_bleu
    from seq2seq.search import translate_batches

    sources, refs = dm.sources("val"), dm.references("val")
    n = min(sentences or len(sources), len(sources))
    batches = list(source_loader(tokenizer, sources[:n], 4096))  # tokenized outside the clock
    ref_len = sum(map(len, tokenizer.encode_batch(refs[:n])))
    model.eval()
    out: dict = {"sentences": n}
    times: dict[int, list[float]] = {1: [], 5: []}
    for _ in range(rounds):  # greedy and beam interleaved, medians over rounds
        for beam in times:
            start = time.perf_counter()
            hyps = translate_batches(model, batches, beam=beam)
            times[beam].append(time.perf_counter() - start)
            name = "greedy" if beam == 1 else f"beam{beam}"
            out[f"{name}_bleu"] = corpus_bleu(
                [tokenizer.decode(h) for h in hyps.tokens], refs[:n]
            ).value
            out[f"{name}_length_ratio"] = sum(map(len, hyps.tokens)) / max(ref_len, 1)
    model.train()
    out["greedy_sent_per_sec"] = n / statistics.median(times[1])
    out["beam5_sent_per_sec"] = n / statistics.median(times[5])
    return out


def callback_overhead(model, dm, sec_per_update: float, calls: int) -> dict:
    """Seconds per AttentionHeatmaps call (on a stand-in trainer) over its share of training time."""
    from lightning.pytorch.loggers import TensorBoardLogger

    from seq2seq.callbacks import AttentionHeatmaps

    every = TrainConfig().heatmap_every
    times = []
    with tempfile.TemporaryDirectory() as tmp:
        logger = TensorBoardLogger(tmp, name="benchmark")
        trainer = SimpleNamespace(datamodule=dm, loggers=[logger], logger=logger, global_step=0,
                                  is_global_zero=True, sanity_checking=False)  # fmt: skip
        module = SimpleNamespace(model=model, tokenizer=dm.tokenizer)
        callback = AttentionHeatmaps(every)
        callback.on_fit_start(trainer, module)
        for i in range(calls + 1):  # the first call builds the figures (once per run): apart
            trainer.global_step = every * (i + 1)
            start = time.perf_counter()
            callback.on_train_batch_end(trainer, module, None, None, 0)
            times.append(time.perf_counter() - start)
        logger.experiment.close()
    call = statistics.median(times[1:])  # later calls redraw only the heatmaps of the first figures
    return {"every_n_steps": every, "first_call_sec": times[0], "call_sec": call,
            "overhead": call / (every * sec_per_update)}  # fmt: skip


def run(args: argparse.Namespace, argv: list[str]) -> dict:
    started = time.perf_counter()
    cfg, dm, model = setup(args)
    runs = paths(cfg, dm, model, ("fast", "bf16", "reference"))
    fast, ref_steps = runs["fast"], max(1, args.steps // 5)  # the reference: ~5x slower per update
    for path in runs.values():
        path.window(1 if args.quick else 2, record=False)  # warm-up: allocator, Adam state
    matmul_burst(2)
    peaks = []
    for w in range(args.windows):  # interleaved, order alternating, so drift hits both alike
        order = list(runs.values())[:: 1 if w % 2 == 0 else -1]
        peaks.append(matmul_burst())
        for path in order:
            path.window(ref_steps if path is runs.get("reference") else args.steps)
    peak = statistics.median(peaks)
    figures = {name: path.figures(peak) for name, path in runs.items()}
    log(f"timed {args.windows} windows in {time.perf_counter() - started:.0f}s")
    if args.checkpoint:
        from seq2seq.system import load_system

        system = load_system(args.checkpoint)  # its own tokenizer, which may differ from dm's
        decoder, tokenizer, trained = system.model, system.tokenizer, None
    else:
        while fast.updates < args.train_updates:
            fast.step(next(fast.batches))
            if fast.updates % 50 == 0:
                log(f"trained {fast.updates}/{args.train_updates} updates")
        decoder, tokenizer, trained = fast.model, dm.tokenizer, fast.updates
    log(f"decoding with {f'the model of {trained} updates' if trained else args.checkpoint}")
    decode = decode_speed(decoder, tokenizer, dm, args.decode_sentences, 1 if args.quick else 2)
    decode.update(trained_updates=trained, checkpoint=args.checkpoint)
    callback = callback_overhead(
        fast.model, dm, figures["fast"]["sec_per_update"], 2 if args.quick else 5
    )
    log("memory probes")
    for name, (peak_mb, before_mb) in peak_memory(argv, list(runs), args.quick).items():
        figures[name].update(peak_rss_mb=peak_mb, rss_before_training_mb=before_mb)
    ref = figures.get("reference")
    return {
        "config": {k: getattr(args, k) for k in REPORTED},
        "vocab": dm.vocab_size,
        "matmul_gflops": peak,
        "matmul_gflops_windows": peaks,
        "fast": figures["fast"],
        "bf16": figures["bf16"],
        "reference": ref,
        "speedup": figures["fast"]["tokens_per_sec"] / ref["tokens_per_sec"] if ref else None,
        "speedup_bf16": figures["bf16"]["tokens_per_sec"] / ref["tokens_per_sec"] if ref else None,
        "speedup_paired": paired_speedup(runs) if ref else None,
        "decode": decode,
        "callback": callback,
        "flops": "matmul FLOPs on real tokens from the layer shapes, 2 per multiply-add, "
        "forward + backward = 3 x forward; elementwise work and padding not counted",
        "memory": "peak RSS of a child process (high-water mark reset after setup): imports, data, "
        "model, Adam and the epoch's heaviest batches by B*S*T",
        "wall_sec": time.perf_counter() - started,
        "loadavg_1min": os.getloadavg()[0],
    }


def paired_speedup(runs: dict[str, Path]) -> float:
    """Median over windows of fast/reference tokens/s of the two windows run next to each other."""
    pairs = zip(runs["fast"].windows, runs["reference"].windows, strict=True)
    return statistics.median((f[1] / f[0]) / (r[1] / r[0]) for f, r in pairs)


def child_argv(argv: list[str]) -> list[str]:
    """The flags without `--json FILE`: a memory probe writes no results."""
    out, skip = [], False
    for a in argv:
        if not skip and not a.startswith("--json"):
            out.append(a)
        skip = a == "--json"
    return out


def log(message: str) -> None:
    print(f"[benchmark] {message}", file=sys.stderr, flush=True)


def table(r: dict) -> str:
    f, b, ref, d, c = r["fast"], r["bf16"], r["reference"] or {}, r["decode"], r["callback"]
    g = lambda x, p=0: "-" if x is None else f"{x:,.{p}f}"  # noqa: E731
    ratio = lambda x, k: "-" if not ref else f"{x[k] / ref[k]:.2f}x"  # noqa: E731
    frac = lambda x: g(100 * x["matmul_fraction"]) if x else "-"  # noqa: E731
    rows = [
        ("train target tokens/s", g(f["tokens_per_sec"]), g(b["tokens_per_sec"]), g(ref.get("tokens_per_sec")),
         ratio(f, "tokens_per_sec"), ratio(b, "tokens_per_sec")),
        ("  the same, median of window pairs", "", "", "", f"{r['speedup_paired']:.2f}x" if ref else "-", ""),
        ("seconds per update", g(f["sec_per_update"], 2), g(b["sec_per_update"], 2), g(ref.get("sec_per_update"), 2),
         ratio(f, "sec_per_update"), ratio(b, "sec_per_update")),
        ("useful GFLOP/s", g(f["useful_gflops"], 1), g(b["useful_gflops"], 1), g(ref.get("useful_gflops"), 1),
         ratio(f, "useful_gflops"), ratio(b, "useful_gflops")),
        (f"  % of fp32 matmul rate ({r['matmul_gflops']:.0f} GFLOP/s)", frac(f), frac(b), frac(ref), "", ""),
        ("MFLOP per target token (fwd+bwd)", g(f["mflop_per_token"], 1), g(b["mflop_per_token"], 1),
         g(ref.get("mflop_per_token"), 1), "", ""),
        ("peak RSS, MB", g(f["peak_rss_mb"]), g(b["peak_rss_mb"]), g(ref.get("peak_rss_mb")),
         ratio(f, "peak_rss_mb"), ratio(b, "peak_rss_mb")),
        (f"greedy sentences/s ({d['sentences']} val)", g(d["greedy_sent_per_sec"]), "-", "-", "", ""),
        ("beam-5 sentences/s", g(d["beam5_sent_per_sec"]), "-", "-", "", ""),
        (f"  BLEU greedy / beam-5 ({d['trained_updates'] or 'checkpoint'} updates)",
         f"{d['greedy_bleu']:.1f} / {d['beam5_bleu']:.1f}", "-", "-", "", ""),
        (f"heatmap callback, every {c['every_n_steps']} steps", f"{100 * c['overhead']:.2g}%", "-", "-", "", ""),
    ]  # fmt: skip
    rows.insert(0, ("", "fast", "fast bf16", "reference", "fast/ref", "bf16/ref"))
    w = [max(len(row[i]) for row in rows) for i in range(6)]
    return "\n".join(
        "  ".join([row[0].ljust(w[0])] + [x.rjust(w[i + 1]) for i, x in enumerate(row[1:])])
        for row in rows
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = parse_args(argv)
        torch.set_num_threads(args.threads)
        if args.memory_probe:
            return memory_probe(args)
        result = run(args, child_argv(argv))
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(table(result))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
