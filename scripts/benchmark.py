"""Training and decoding speed of the fast path beside the textbook reference, side by side in one run.

    python scripts/benchmark.py [--quick] [--device cpu|cuda|auto] [--json benchmark.json]

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

`--device cuda` runs the same code on a GPU: model, batches, both paths and decoding live there and
every clock is read after `torch.cuda.synchronize()`. The matmul reference is then an 8192x8192 matmul
in fp32 and in bf16: the fp32 columns' share is of the fp32 rate, the bf16 column's of the bf16 rate.
Peak memory is `torch.cuda.max_memory_allocated` over each path's heaviest batches, all paths in this
one process (the CPU RSS probes are skipped). The heatmap callback still draws from a CPU copy of the
model, as in training.
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
REPORTED = ("model", "score", *SIZES, "threads", "steps", "windows", "train_updates", "quick",
            "device")  # fmt: skip
# The matmul whose rate useful GFLOP/s are shares of, per device type: size n, timed repetitions,
# warm-ups. 1024 keeps CPU cores busy; a big GPU needs 8192 to reach its rate.
MATMUL = {"cpu": (1024, 8, 1), "cuda": (8192, 10, 3)}


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
        "--device",
        choices=("cpu", "cuda", "auto"),
        default="cpu",
        help="where models train and decode (auto: cuda when there is one)",
    )
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
    """One training path: its model copy, Adam, a batch stream (on the model's device) and a loss."""

    def __init__(
        self, model, batches, loss, cfg: TrainConfig, vocab: int, bf16: bool = False
    ) -> None:
        self.model, self.all, self.loss = model.train(), batches, loss
        self.device = next(model.parameters()).device
        self.bf16 = bf16  # matmuls under bf16 autocast (what --precision bf16-mixed does)
        self.cfg, self.vocab, self.updates = cfg, vocab, 0
        # Each batch with its target tokens and FLOPs, counted here: no host sync inside a window.
        work = [(b, float(b["tgt_mask"].sum()), 3 * forward_flops(cfg, vocab, b)) for b in batches]
        self.batches = cycle(work)
        self.opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, betas=(0.9, 0.98), eps=1e-9)
        self.windows: list[tuple[float, float, float, int]] = []  # seconds, tokens, FLOPs, steps

    def step(self, batch: dict) -> None:
        bf16 = torch.bfloat16
        with torch.autocast(device_type=self.device.type, dtype=bf16, enabled=self.bf16):
            loss_sum, _, tokens = self.loss(self.model, batch, self.cfg.label_smoothing)[:3]
        self.opt.zero_grad(set_to_none=True)
        (loss_sum / tokens).backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.clip_norm)
        self.opt.step()
        self.updates += 1

    def window(self, steps: int, record: bool = True) -> None:
        start, tokens, flops = clock(self.device), 0.0, 0.0
        for _ in range(steps):
            batch, n, f = next(self.batches)
            self.step(batch)
            tokens, flops = tokens + n, flops + f
        if record:
            self.windows.append((clock(self.device) - start, tokens, flops, steps))

    def figures(self, rates: dict[str, float]) -> dict:
        """Medians over windows; the matmul share is of the bf16 rate for the bf16 path where there is
        one (CUDA), else of the fp32 rate."""
        against = "bf16" if self.bf16 and "bf16" in rates else "fp32"
        rate = statistics.median(n / s for s, n, _, _ in self.windows)
        gflops = statistics.median(f / s / 1e9 for s, _, f, _ in self.windows)
        return {
            "tokens_per_sec": rate,
            "sec_per_update": statistics.median(s / k for s, _, _, k in self.windows),
            "useful_gflops": gflops,
            "matmul_fraction": gflops / rates[against],
            "matmul_fraction_of": against,
            "mflop_per_token": sum(w[2] for w in self.windows)
            / sum(w[1] for w in self.windows)
            / 1e6,
            "windows": [{"sec": s, "tokens": n, "steps": k} for s, n, _, k in self.windows],
        }


def clock(device: torch.device) -> float:
    """time.perf_counter() once the device has finished its queued work (CUDA runs asynchronously)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def to_device(batch: dict, device: torch.device) -> dict:
    """The batch's tensors on `device`, but `index`: bookkeeping, read on the host."""
    return {k: v if k == "index" else v.to(device) for k, v in batch.items()}


def matmul_rates(device: torch.device, reps: int | None = None) -> dict[str, float]:
    """GFLOP/s of an n x n matmul on `device` (the CPU: on the current threads), the mean of `reps`
    after warm-ups (MATMUL): fp32, and on CUDA bf16 too."""
    n, default_reps, warmups = MATMUL[device.type]
    reps = reps or default_reps
    dtypes = {"fp32": torch.float32}
    if device.type == "cuda":
        dtypes["bf16"] = torch.bfloat16
    rates = {}
    for name, dtype in dtypes.items():
        a = torch.randn(n, n, device=device, dtype=dtype)  # (n, n)
        b = torch.randn(n, n, device=device, dtype=dtype)  # (n, n)
        for _ in range(warmups):
            torch.mm(a, b)
        start = clock(device)
        for _ in range(reps):
            torch.mm(a, b)
        rates[name] = reps * 2 * n**3 / (clock(device) - start) / 1e9
    return rates


def setup(args: argparse.Namespace, device: torch.device):
    from seq2seq.data import TranslationDataModule
    from seq2seq.models import build_model

    cfg = config_of(args)
    dm = TranslationDataModule(corpus=cfg.dataset, data_dir=cfg.data_dir, vocab_size=cfg.vocab_size,
                               batch_tokens=cfg.batch_tokens, max_len=cfg.max_len, seed=cfg.seed)  # fmt: skip
    dm.prepare_data()
    dm.setup("fit")
    torch.manual_seed(cfg.seed)
    return cfg, dm, build_model(cfg, dm.vocab_size).to(device)


def twin(model):
    """A deep copy of `model`, its GRU weights flattened again into one cuDNN buffer (on CUDA; a no-op
    on the CPU): deepcopy leaves them apart, and cuDNN would then compact them at every call."""
    out = copy.deepcopy(model)
    for module in out.modules():
        if isinstance(module, torch.nn.RNNBase):
            module.flatten_parameters()
    return out


def paths(cfg: TrainConfig, dm, model, which: tuple[str, ...]) -> dict[str, Path]:
    from seq2seq.reference import reference_loss, textbook_loader
    from seq2seq.system import batch_loss

    device = next(model.parameters()).device
    fast = [to_device(b, device) for b in dm.train_dataloader()]  # collated and moved off the clock
    out = {"fast": Path(model, fast, batch_loss, cfg, dm.vocab_size)}
    if "bf16" in which:
        out["bf16"] = Path(twin(model), fast, batch_loss, cfg, dm.vocab_size, bf16=True)
    if "reference" in which and cfg.model == "rnn":
        size = max(1, round(len(dm.datasets["train"]) / len(fast)))  # as many batches per epoch
        ref = [to_device(b, device) for b in textbook_loader(dm.datasets["train"], size, cfg.max_len,
                                                             cfg.seed)]  # fmt: skip
        out["reference"] = Path(twin(model), ref, reference_loss, cfg, dm.vocab_size)
    return out


def rss_mb(field: str = "VmHWM") -> float:
    """The process's peak (VmHWM) or current (VmRSS) resident set from /proc; ru_maxrss elsewhere."""
    try:
        with open("/proc/self/status") as status:
            return next(int(ln.split()[1]) / 1024 for ln in status if ln.startswith(field + ":"))
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


def heaviest(batches: list[dict], quick: bool) -> list[dict]:
    """The epoch's heaviest batches, by B * T * S: activations grow with it (the additive energies of
    every step are kept for backward). One with --quick, else three."""
    heavy = sorted(batches, key=lambda b: -b["tgt_in"].numel() * b["src"].size(1))
    return heavy[: 1 if quick else 3]


def memory_probe(args: argparse.Namespace, device: torch.device) -> int:
    """Child process: train on the heaviest batches of an epoch of one path; print peak RSS as JSON.

    The high-water mark is reset after setup (Linux: /proc/self/clear_refs), so a tokenizer or cache
    built on a first run does not count; what stays resident from setup does.
    """
    cfg, dm, model = setup(args, device)
    path = paths(cfg, dm, model, (args.memory_probe,))[args.memory_probe]
    try:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")
    except OSError:
        pass  # the peak then includes setup
    before = rss_mb("VmRSS")
    for batch in heaviest(path.all, args.quick):
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


def gpu_peak_memory(runs: dict[str, Path], quick: bool) -> dict[str, tuple[float, float]]:
    """Per path, CUDA's peak allocated memory (MB) over its heaviest batches, the peak reset just before
    them, and what was allocated at that reset. All paths share this process: both figures include every
    path's weights, Adam state and batches; the difference is this path's training work."""
    out = {}
    for name, path in runs.items():
        torch.cuda.synchronize(path.device)
        torch.cuda.reset_peak_memory_stats(path.device)
        before = torch.cuda.memory_allocated(path.device) / 2**20
        for batch in heaviest(path.all, quick):
            path.step(batch)
        torch.cuda.synchronize(path.device)
        out[name] = torch.cuda.max_memory_allocated(path.device) / 2**20, before
    return out


def decode_speed(model, tokenizer, dm, sentences: int, rounds: int) -> dict:
    """Greedy and beam-5 sentences/second on the validation sources, batched as evaluate.py does."""
    from seq2seq.data import source_loader
    from seq2seq.metrics import corpus_bleu
    from seq2seq.search import translate_batches

    sources, refs = dm.sources("val"), dm.references("val")
    n = min(sentences or len(sources), len(sources))
    device = next(model.parameters()).device
    loader = source_loader(tokenizer, sources[:n], 4096)
    batches = [to_device(b, device) for b in loader]  # tokenized and moved outside the clock
    ref_len = sum(map(len, tokenizer.encode_batch(refs[:n])))
    model.eval()
    out: dict = {"sentences": n}
    times: dict[int, list[float]] = {1: [], 5: []}
    for _ in range(rounds):  # greedy and beam interleaved, medians over rounds
        for beam in times:
            start = clock(device)
            hyps = translate_batches(model, batches, beam=beam)
            times[beam].append(clock(device) - start)
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

    every, device = TrainConfig().heatmap_every, next(model.parameters()).device
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
            start = clock(device)
            callback.on_train_batch_end(trainer, module, None, None, 0)  # draws from a CPU copy
            times.append(clock(device) - start)
        logger.experiment.close()
    call = statistics.median(times[1:])  # later calls redraw only the heatmaps of the first figures
    return {"every_n_steps": every, "first_call_sec": times[0], "call_sec": call,
            "overhead": call / (every * sec_per_update)}  # fmt: skip


def run(args: argparse.Namespace, device: torch.device, argv: list[str]) -> dict:
    started = time.perf_counter()
    info = device_info(device)
    if device.type == "cuda":
        log(", ".join(f"{k} {v}" for k, v in info.items()))
    cfg, dm, model = setup(args, device)
    runs = paths(cfg, dm, model, ("fast", "bf16", "reference"))
    fast, ref_steps = runs["fast"], max(1, args.steps // 5)  # the reference: ~5x slower per update
    left_out = {}  # path -> the error that stopped it
    for name, path in list(runs.items()):
        try:
            path.window(1 if args.quick else 2, record=False)  # warm-up: allocator, Adam state
        except RuntimeError as err:  # e.g. an op with no bf16 kernel here: the other paths go on
            if path is fast:
                raise
            left_out[name] = first_line(err)
            log(f"{name} path left out: {left_out[name]}")
            del runs[name]
    matmul_rates(device, reps=2)
    windows = []
    for w in range(args.windows):  # interleaved, order alternating, so drift hits both alike
        order = list(runs.values())[:: 1 if w % 2 == 0 else -1]
        windows.append(matmul_rates(device))
        for path in order:
            path.window(ref_steps if path is runs.get("reference") else args.steps)
    rates = {k: statistics.median(r[k] for r in windows) for k in windows[0]}
    figures = {name: path.figures(rates) for name, path in runs.items()}
    log(f"timed {args.windows} windows in {time.perf_counter() - started:.0f}s")
    if args.checkpoint:
        from seq2seq.system import load_system

        system = load_system(args.checkpoint)  # its own tokenizer, which may differ from dm's
        decoder, tokenizer, trained = system.model.to(device), system.tokenizer, None
    else:
        while fast.updates < args.train_updates:
            fast.step(next(fast.batches)[0])
            if fast.updates % 50 == 0:
                log(f"trained {fast.updates}/{args.train_updates} updates")
        decoder, tokenizer, trained = fast.model, dm.tokenizer, fast.updates
    log(f"decoding with {f'the model of {trained} updates' if trained else args.checkpoint}")
    decode = decode_speed(decoder, tokenizer, dm, args.decode_sentences, 1 if args.quick else 2)
    decode.update(trained_updates=trained, checkpoint=args.checkpoint)
    callback = callback_overhead(
        fast.model, dm, figures["fast"]["sec_per_update"], 2 if args.quick else 5
    )
    if device.type == "cuda":
        log("memory: torch.cuda.max_memory_allocated per path; CPU RSS probes skipped on cuda")
        for name, (peak_mb, before_mb) in gpu_peak_memory(runs, args.quick).items():
            figures[name].update(peak_gpu_mb=peak_mb, gpu_before_training_mb=before_mb)
        memory = ("torch.cuda.max_memory_allocated over the epoch's heaviest batches by B*S*T, the "
                  "peak reset just before them, all paths in one process (so with every path's model, "
                  "Adam state and batches: gpu_before_training_mb); CPU RSS probes skipped on cuda")  # fmt: skip
    else:
        log("memory probes")
        for name, (peak_mb, before_mb) in peak_memory(argv, list(runs), args.quick).items():
            figures[name].update(peak_rss_mb=peak_mb, rss_before_training_mb=before_mb)
        memory = ("peak RSS of a child process (high-water mark reset after setup): imports, data, "
                  "model, Adam and the epoch's heaviest batches by B*S*T")  # fmt: skip
    ref, bf16 = figures.get("reference"), figures.get("bf16")
    info["bf16_autocast_encoder_dtype"] = autocast_encoder_dtype(fast.model, fast.all[0])
    return {
        "config": {k: getattr(args, k) for k in REPORTED},
        "device": info,
        "vocab": dm.vocab_size,
        "matmul_gflops": rates["fp32"],
        "matmul_gflops_windows": [r["fp32"] for r in windows],
        "matmul_bf16_gflops": rates.get("bf16"),
        "matmul_bf16_gflops_windows": [r["bf16"] for r in windows] if "bf16" in rates else None,
        "matmul": "{0}x{0} matmul, the mean of {1} after {2} warm-ups, in each window; fast and "
        "reference are shares of its fp32 rate, bf16 of its bf16 rate where measured (CUDA), else "
        "of the fp32 rate".format(*MATMUL[device.type]),
        "fast": figures["fast"],
        "bf16": bf16,
        "reference": ref,
        "left_out": left_out,
        "speedup": figures["fast"]["tokens_per_sec"] / ref["tokens_per_sec"] if ref else None,
        "speedup_bf16": bf16["tokens_per_sec"] / ref["tokens_per_sec"] if ref and bf16 else None,
        "speedup_paired": paired_speedup(runs) if ref else None,
        "decode": decode,
        "callback": callback,
        "flops": "matmul FLOPs on real tokens from the layer shapes, 2 per multiply-add, "
        "forward + backward = 3 x forward; elementwise work and padding not counted",
        "memory": memory,
        "wall_sec": time.perf_counter() - started,
        "loadavg_1min": os.getloadavg()[0],
    }


def device_info(device: torch.device) -> dict:
    """Where the figures come from; on CUDA the GPU, cuDNN (the encoder's nn.GRU runs on it) and the
    fp32 precision (TF32 or not) of matmuls and of cuDNN RNNs."""
    info: dict = {"type": device.type, "torch": torch.__version__}
    if device.type == "cuda":
        cudnn_rnn = getattr(getattr(torch.backends.cudnn, "rnn", None), "fp32_precision", None)
        info.update(
            name=torch.cuda.get_device_name(device),
            cuda=torch.version.cuda,
            cudnn=torch.backends.cudnn.version(),
            float32_matmul_precision=torch.get_float32_matmul_precision(),  # highest: no TF32
            cudnn_rnn_fp32_precision=cudnn_rnn or f"allow_tf32={torch.backends.cudnn.allow_tf32}",
        )
    return info


def autocast_encoder_dtype(model, batch: dict) -> str | None:
    """The dtype of the GRU encoder's output under bf16 autocast, None for the Transformer. float32 on
    the CPU; CUDA's autocast wrapper of cuDNN RNNs (ATen/cudnn/AutocastRNN.cpp) casts to float16."""
    encoder = getattr(model, "encoder", None)
    if not isinstance(getattr(encoder, "rnn", None), torch.nn.RNNBase):
        return None
    device = next(model.parameters()).device
    try:
        with torch.no_grad(), torch.autocast(device_type=device.type, dtype=torch.bfloat16):
            enc_out = encoder(batch["src"], batch["src_lens"])  # (B, S, H)
        return str(enc_out.dtype).removeprefix("torch.")
    except RuntimeError as err:  # the bf16 path was then left out for the same reason
        return f"error: {first_line(err)}"


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


def first_line(err: Exception) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def log(message: str) -> None:
    print(f"[benchmark] {message}", file=sys.stderr, flush=True)


def table(r: dict) -> str:
    f, b, ref, d, c = r["fast"], r["bf16"] or {}, r["reference"] or {}, r["decode"], r["callback"]
    dev, bf16_rate = r["device"], r["matmul_bf16_gflops"]
    g = lambda x, p=0: "-" if x is None else f"{x:,.{p}f}"  # noqa: E731
    ratio = lambda x, k: "-" if not ref or not x else f"{x[k] / ref[k]:.2f}x"  # noqa: E731
    frac = lambda x: g(100 * x["matmul_fraction"]) if x else "-"  # noqa: E731
    shares = f"  % of fp32 matmul rate ({r['matmul_gflops']:.0f} GFLOP/s)"
    if bf16_rate is not None:  # CUDA: the bf16 column's share is of the bf16 rate
        fp32, bf16 = r["matmul_gflops"], bf16_rate
        shares = f"  % of matmul rate (fp32 {fp32:,.0f}; bf16 col.: bf16 {bf16:,.0f} GFLOP/s)"
    mem, memory = "peak_rss_mb", "peak RSS, MB"
    if dev["type"] == "cuda":
        mem, memory = "peak_gpu_mb", "peak GPU memory allocated, MB"
    rows = [
        ("train target tokens/s", g(f["tokens_per_sec"]), g(b.get("tokens_per_sec")), g(ref.get("tokens_per_sec")),
         ratio(f, "tokens_per_sec"), ratio(b, "tokens_per_sec")),
        ("  the same, median of window pairs", "", "", "", f"{r['speedup_paired']:.2f}x" if ref else "-", ""),
        ("seconds per update", g(f["sec_per_update"], 2), g(b.get("sec_per_update"), 2),
         g(ref.get("sec_per_update"), 2), ratio(f, "sec_per_update"), ratio(b, "sec_per_update")),
        ("useful GFLOP/s", g(f["useful_gflops"], 1), g(b.get("useful_gflops"), 1), g(ref.get("useful_gflops"), 1),
         ratio(f, "useful_gflops"), ratio(b, "useful_gflops")),
        (shares, frac(f), frac(b), frac(ref), "", ""),
        ("MFLOP per target token (fwd+bwd)", g(f["mflop_per_token"], 1), g(b.get("mflop_per_token"), 1),
         g(ref.get("mflop_per_token"), 1), "", ""),
        (memory, g(f[mem]), g(b.get(mem)), g(ref.get(mem)), ratio(f, mem), ratio(b, mem)),
        (f"greedy sentences/s ({d['sentences']} val)", g(d["greedy_sent_per_sec"]), "-", "-", "", ""),
        ("beam-5 sentences/s", g(d["beam5_sent_per_sec"]), "-", "-", "", ""),
        (f"  BLEU greedy / beam-5 ({d['trained_updates'] or 'checkpoint'} updates)",
         f"{d['greedy_bleu']:.1f} / {d['beam5_bleu']:.1f}", "-", "-", "", ""),
        (f"heatmap callback, every {c['every_n_steps']} steps", f"{100 * c['overhead']:.2g}%", "-", "-", "", ""),
    ]  # fmt: skip
    rows.insert(0, ("", "fast", "fast bf16", "reference", "fast/ref", "bf16/ref"))
    w = [max(len(row[i]) for row in rows) for i in range(6)]
    notes = [f"{name} path left out: {error}" for name, error in r["left_out"].items()]
    if dev["type"] == "cuda":
        notes += [
            f"device: {dev['name']}, CUDA {dev['cuda']}, cuDNN {dev['cudnn']}, torch {dev['torch']}; fp32 "
            f"matmuls {dev['float32_matmul_precision']}, cuDNN RNN fp32 {dev['cudnn_rnn_fp32_precision']}, "
            f"encoder under bf16 autocast: {dev['bf16_autocast_encoder_dtype']}",
            "peak GPU memory: torch.cuda.max_memory_allocated, all paths in one process; "
            "the CPU RSS probes are skipped on cuda",
        ]  # fmt: skip
    return "\n".join(
        [
            "  ".join([row[0].ljust(w[0])] + [x.rjust(w[i + 1]) for i, x in enumerate(row[1:])])
            for row in rows
        ]
        + notes
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = parse_args(argv)
        torch.set_num_threads(args.threads)
        from seq2seq.system import pick_device

        device = pick_device(args.device)  # --device cuda without CUDA: a UserError
        if args.memory_probe:
            return memory_probe(args, device)
        result = run(args, device, child_argv(argv))
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.json:  # before the table: the figures are kept even if printing them failed
        with open(args.json, "w") as out:
            json.dump(result, out, indent=2)
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
