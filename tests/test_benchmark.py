"""The textbook reference equals the fast path; FLOPs per token match PyTorch's counter; both benchmark
scripts run end to end and report every figure (their structure, never their timings)."""

import copy
import json

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from seq2seq.benchmarks import memory as benchmark_memory
from seq2seq.benchmarks import plots as plot_benchmarks
from seq2seq.benchmarks import speed as benchmark
from seq2seq.data.batching import collate
from seq2seq.models.kernels import accelerate
from seq2seq.models.reference import reference_loss
from seq2seq.models.rnn import RNNSeq2Seq
from seq2seq.models.transformer import TransformerSeq2Seq
from seq2seq.training.config import TrainConfig
from seq2seq.training.losses import batch_loss

TINY = ["--vocab-size", "100", "--emb-size", "16", "--hidden-size", "32", "--batch-tokens", "400"]


def random_batch(vocab: int, lengths: list[tuple[int, int]]) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    items = [
        {"src_ids": torch.randint(4, vocab, (s,), generator=gen).tolist(),
         "tgt_ids": torch.randint(4, vocab, (t,), generator=gen).tolist(), "index": i}
        for i, (s, t) in enumerate(lengths)
    ]  # fmt: skip
    return collate(items)


@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.parametrize("score", ["additive", "dot", "scaled"])
def test_reference_path_equals_fast_path_in_loss_and_gradients(score: str, tie: bool) -> None:
    """The textbook model read by `reference_loss`, against training's loss on a copy with kernels."""
    torch.manual_seed(0)
    model = RNNSeq2Seq(40, emb_size=8, hidden_size=12, score=score, attn_size=10, dropout=0.0,
                       tie_embeddings=tie)  # fmt: skip
    kernels = accelerate(copy.deepcopy(model))
    # Uneven lengths on both sides: padding in the source, the target, and the longest of each apart.
    batch = random_batch(40, [(6, 3), (2, 9), (11, 5), (4, 4)])
    grads = []
    for loss_fn, net in ((batch_loss, kernels), (reference_loss, model)):
        net.zero_grad()
        loss_sum, nll_sum, tokens = loss_fn(net, batch, 0.1)[:3]
        (loss_sum / tokens).backward()
        grads.append({n: p.grad.clone() for n, p in net.named_parameters()})
        grads[-1]["_sums"] = torch.stack([loss_sum.detach(), nll_sum, tokens.float()])
    fast, ref = grads
    assert fast.keys() == ref.keys()
    for name in fast:
        torch.testing.assert_close(fast[name], ref[name], rtol=1e-4, atol=1e-6, msg=name)


def test_textbook_loader_gives_random_fixed_size_batches(
    tiny_corpus, tmp_path, monkeypatch
) -> None:
    from seq2seq.data.datamodule import TranslationDataModule

    monkeypatch.chdir(tmp_path)
    dm = TranslationDataModule(TrainConfig(data_dir=str(tiny_corpus), vocab_size=100))
    dm.prepare_data()
    dm.setup("fit")
    batches = list(benchmark.textbook_loader(dm.datasets["train"], 16, max_len=100, seed=1))
    assert [b["src"].size(0) for b in batches[:-1]] == [16] * (len(batches) - 1)
    order = torch.cat([b["index"] for b in batches])
    assert sorted(order.tolist()) == list(range(len(dm.datasets["train"])))
    assert order.tolist() != sorted(order.tolist())  # shuffled, not length-sorted


@pytest.mark.parametrize("score", ["additive", "dot", "scaled"])
def test_bf16_autocast_path_computes_nearly_the_same_loss(score: str) -> None:
    torch.manual_seed(0)
    model = accelerate(RNNSeq2Seq(40, emb_size=16, hidden_size=32, score=score, dropout=0.0))
    batch = random_batch(40, [(6, 3), (2, 9), (11, 5), (4, 4)])
    fp32 = batch_loss(model, batch, 0.1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        bf16 = batch_loss(model, batch, 0.1)
    assert bf16[0].dtype == torch.float32  # the loss itself is reduced in fp32
    torch.testing.assert_close(bf16[0], fp32[0], rtol=0.02, atol=0.0)
    assert not torch.equal(bf16[0], fp32[0])  # it did run in bf16


@pytest.mark.parametrize("score", ["additive", "dot", "scaled"])
def test_the_recurrence_in_bf16_as_on_a_gpu_gives_nearly_the_same_loss_and_gradients(
    score: str,
) -> None:
    # On a CPU the kernels' encoder and decoder steps leave autocast
    # (seq2seq.models.kernels.decoder.Fp32RecurrenceRNN); on a GPU they run in bf16. The textbook
    # model emulates that here: autocast reaches its recurrence.
    torch.manual_seed(0)
    model = RNNSeq2Seq(40, emb_size=16, hidden_size=32, score=score, dropout=0.0)
    batch = random_batch(40, [(6, 3), (2, 9), (11, 5), (4, 4)])
    dtypes = []  # of the bf16 run's GRU cell steps
    model.decoder.cell.register_forward_hook(lambda m, args, out: dtypes.append(out.dtype))
    results = []
    for bf16 in (False, True):
        dtypes.clear()
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss_sum, _, tokens, _ = batch_loss(model, batch, 0.1)
        (loss_sum / tokens).backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        results.append((loss_sum.detach(), grads))
    assert set(dtypes) == {torch.bfloat16}  # the GRU cell ran in bf16, every step
    (loss32, grad32), (loss16, grad16) = results
    torch.testing.assert_close(loss16, loss32, rtol=0.02, atol=0.0)
    # bf16 keeps 8 bits of mantissa: the gradient's direction within 1%, its length within 5%.
    assert F.cosine_similarity(grad16, grad32, dim=0) > 0.99
    assert abs(grad16.norm() / grad32.norm() - 1) < 0.05


@pytest.mark.parametrize(
    "model",
    [RNNSeq2Seq(50, 16, 32, "additive", dropout=0.0),
     RNNSeq2Seq(50, 16, 32, "dot", dropout=0.0, enc_layers=2, tie_embeddings=False),
     TransformerSeq2Seq(50, 32, heads=4, layers=2, ff_size=64, dropout=0.0, attn_dropout=0.0)],
    ids=["gru-additive", "gru-dot-2-layers", "transformer"],
)  # fmt: skip
@pytest.mark.parametrize("lengths", [(12, 9), (5, 20)])
def test_flops_per_token_matches_pytorchs_flop_counter(
    model, lengths: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        "seq2seq.training.losses.ROWS", 1
    )  # the output layer's zero rows are not useful work
    batch = random_batch(50, [lengths])  # one sentence: no padding, every FLOP is useful
    # Counted on autograd's own backward of the textbook modules. The CPU's training kernels
    # (seq2seq.models.kernels.deferred) do the additive energies' outer products elementwise instead.
    s, t = float(batch["src_lens"][0]), float(batch["tgt_mask"].sum())
    # The math backend's attention is plain matmuls, which the counter sees (fused kernels it may not).
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        (batch_loss(model, batch, 0.1)[0] / t).backward()
    expected = model.flops_per_token(s, t) * t
    if isinstance(model, TransformerSeq2Seq):  # the counter also counts the masked half of causal
        H, L = model.d_model, len(model.decoder)
        expected += 3 * L * 4 * H * (t * t - t * (t + 1) / 2)
    # The GRU's: backward skips the gradient of the zero initial state, one step per direction.
    torch.testing.assert_close(float(counter.get_total_flops()), expected, rtol=0.01, atol=0)


@pytest.mark.slow
def test_quick_benchmark_writes_every_figure(tiny_corpus, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)  # the data cache goes to ./data/cache
    out = tmp_path / "bench.json"
    eager = [k for k in benchmark.PATHS if not benchmark.PATHS[k].compiles]  # compiled: below
    argv = ["--quick", "--data-dir", str(tiny_corpus), *TINY, "--train-updates", "12",
            "--json", str(out), "--force-bf16", "--paths", *eager]  # bf16 on any CPU  # fmt: skip
    assert benchmark.main(argv) == 0
    result = json.loads(out.read_text())
    assert list(result["paths"]) == eager == ["fast", "bf16", "reference"]
    for name, figures in result["paths"].items():
        for key in ("tokens_per_sec", "sec_per_update", "matmul_pct", "warmup_sec"):
            assert figures[key] > 0, (name, key)
        assert figures["peak_gpu_mb"] is None  # CPU: no GPU column
    assert result["paths"]["reference"]["vs_reference"] == 1.0
    assert result["mflop_per_token"] > 0 and result["matmul"]["fp32"] > 0
    assert len(result["rounds"]) == 3 and result["device"] == "cpu"
    decode = result["decode"]
    assert decode["sentences"] == 20 and decode["trained_updates"] == 12
    assert decode["greedy_sent_per_sec"] > 0 and decode["beam5_sent_per_sec"] > 0
    printed = capsys.readouterr()
    table = printed.out
    assert "vs reference" in table and "beam-5" in table and "peak GPU" not in table
    # Decoding is timed before any path's windows, as in a process that only translates.
    assert printed.err.index("decoding 20 validation") < printed.err.index("round 1/3")
    assert table.count("\n") == 1 + 1 + 1 + 3 + 2  # header, cpu, column heads, 3 paths, 2 lines
    cpu = result["cpu"]
    assert f"cpu: {cpu['model']}, capability {torch.backends.cpu.get_cpu_capability()}" in table
    # Progress on stderr while it runs: one line per round, with every path's speed.
    rounds = [line for line in printed.err.splitlines() if line.startswith("round ")]
    assert [line.split(":")[0] for line in rounds] == ["round 1/3", "round 2/3", "round 3/3"]
    assert all(f"{name} " in rounds[0] for name in result["paths"])
    # A CPU without native bf16 gets a row saying why its bf16 path did not run.
    del result["paths"]["bf16"]
    result["skipped"] = {"bf16": "skipped: no native bf16 on this CPU (AVX2)"}
    assert "\nbf16       skipped: no native bf16" in benchmark.render(result)
    # A CUDA run's table (not runnable here) gains a peak-memory column and the bf16 matmul rate.
    result["device"], result["matmul"]["bf16"] = "NVIDIA H200", 700_000.0
    for figures in result["paths"].values():
        figures["peak_gpu_mb"] = 630.0
    gpu = benchmark.render(result)
    assert "peak GPU MB" in gpu and "bf16 700,000" in gpu and "NVIDIA H200" in gpu
    # plot_benchmarks draws the JSON as written: a bar per path, tallest where tokens/s are highest.
    assert plot_benchmarks.main(["--speed", str(out), "--out-dir", str(tmp_path)]) == 0
    assert (tmp_path / "speed.png").stat().st_size > 0
    written = json.loads(out.read_text())
    bars = plot_benchmarks.speed_figure(written).axes[0].patches
    speeds = [f["tokens_per_sec"] for f in written["paths"].values()]
    assert [bar.get_height() for bar in bars] == pytest.approx(speeds)
    # A skipped path is a labelled gap after the bars that ran.
    written["skipped"] = {"bf16": "skipped: no native bf16"}
    del written["paths"]["bf16"]
    ax = plot_benchmarks.speed_figure(written).axes[0]
    assert len(ax.patches) == 2 and [t.get_text() for t in ax.get_xticklabels()][-1] == "bf16"


def test_bf16_path_is_skipped_on_a_cpu_without_native_bf16() -> None:
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    without, native = {"native_bf16": False, "capability": "AVX2"}, {"native_bf16": True}
    names, skipped = benchmark.path_names(cpu, without, force_bf16=False)
    assert names == ["fast", "compiled", "reference"]
    assert list(skipped) == ["bf16", "compiled-bf16"]
    assert "no native bf16" in skipped["bf16"] and "AVX2" in skipped["bf16"]
    for device, cpu_info, force in (
        (cpu, native, False),
        (cpu, without, True),
        (gpu, without, False),
    ):
        assert benchmark.path_names(device, cpu_info, force) == (list(benchmark.PATHS), {})
    assert benchmark.cpu_info()["native_bf16"] == torch.ops.mkldnn._is_mkldnn_bf16_supported()


def test_memory_benchmark_skips_bf16_like_benchmark_py_on_a_cpu_without_it() -> None:
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    without, native = {"native_bf16": False, "capability": "AVX2"}, {"native_bf16": True}
    asked = ["32-true", "bf16-mixed"]
    names, precisions, skipped = benchmark_memory.plan(benchmark, cpu, without, asked, False)
    assert names == ["fast", "compiled", "reference"] and precisions == ["32-true"]
    assert (
        list(skipped) == ["bf16", "compiled-bf16", "bf16-mixed"] and "AVX2" in skipped["bf16-mixed"]
    )
    everything = (list(benchmark.PATHS), asked, {})
    assert benchmark_memory.plan(benchmark, cpu, without, asked, True) == everything
    assert benchmark_memory.plan(benchmark, cpu, native, asked, False) == everything
    assert benchmark_memory.plan(benchmark, gpu, None, asked, False) == everything


@pytest.mark.slow
def test_quick_memory_benchmark_reports_probes_runs_and_heatmaps(
    tiny_corpus, tmp_path, monkeypatch, capsys
) -> None:
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "memory.json"
    argv = ["--quick", "--updates", "4", "--data-dir", str(tiny_corpus), *TINY, "--json", str(out)]
    assert benchmark_memory.main([*argv, "--force-bf16"]) == 0  # both precisions on any CPU
    result = json.loads(out.read_text())
    assert list(result["probe"]) == [k for k in benchmark.PATHS if not benchmark.PATHS[k].compiles]
    for probe in result["probe"].values():
        assert probe["peak_rss_mb"] >= probe["rss_before_mb"] > 0
    assert list(result["train"]) == ["32-true", "bf16-mixed"]
    for run in result["train"].values():
        assert run["code"] == 0 and run["updates"] == 4
        assert [r["update"] for r in run["rss"]] == [0, 1, 2, 3, 4]  # --every: updates / 4
        assert run["peak_rss_mb"] >= max(r["mb"] for r in run["rss"]) > 0
        kinds = [kind for kind, _ in run["draws"]]
        # Teacher-forced at the start and every update (updates / 4); greedy at both validations.
        assert kinds.count("teacher-forced") == 5 and kinds.count("greedy") == 2
        assert len(run["val_sec"]) == 2
        heatmaps = run["heatmaps"]
        assert 0 < heatmaps["share_of_run"] < 1 and 0 < heatmaps["share_at_defaults"] < 1
        assert heatmaps["greedy_sec"] > 0 and heatmaps["teacher_forced_sec"] > 0
    table = capsys.readouterr().out
    assert "bf16-mixed" in table and "RSS at update 4" in table and "share at defaults" in table
    assert table.startswith(f"cpu: {benchmark.describe_cpu(result['cpu'])}\n")
    # plot_benchmarks: per run, its RSS readings over updates and its peak as a flat line.
    assert plot_benchmarks.main(["--memory", str(out), "--out-dir", str(tmp_path)]) == 0
    assert (tmp_path / "memory.png").stat().st_size > 0
    lines = plot_benchmarks.memory_figure(result).axes[0].get_lines()
    assert len(lines) == 2 * len(result["train"])
    pairs = zip(result["train"].values(), lines[::2], lines[1::2], strict=True)
    for run, rss, peak in pairs:
        assert list(rss.get_xdata()) == [0, 1, 2, 3, 4]
        assert list(rss.get_ydata()) == [r["mb"] for r in run["rss"]]
        assert set(peak.get_ydata()) == {run["peak_rss_mb"]}


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal needs a machine without CUDA")
@pytest.mark.parametrize("script", [benchmark, benchmark_memory])
def test_device_cuda_without_cuda_is_refused_in_one_line(script, capsys) -> None:
    assert script.main(["--device", "cuda", "--quick"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: --device cuda") and "CUDA" in err


def test_paths_without_fast_are_refused_in_one_line(capsys) -> None:
    with pytest.raises(SystemExit) as stopped:
        benchmark.main(["--paths", "bf16"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--paths must include fast" in err[0] and "(see --help)" in err[0]


def test_profile_split_counts_each_matmul_once_by_dtype_with_its_flops():
    """docs/tools/profile_update.py's split: fp32 and bf16 matmuls apart, FLOPs from the shapes
    (addmm's added term skipped, bmm's batch counted), and every other aten op as 'other'."""
    from torch.profiler import ProfilerActivity, profile

    from seq2seq.benchmarks import profile as profile_update

    a, b, bias = torch.randn(6, 4), torch.randn(4, 3), torch.randn(3)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        a @ b  # fp32: 2 * 6 * 4 * 3
        torch.addmm(bias.bfloat16(), a.bfloat16(), b.bfloat16())  # bf16: 2 * 6 * 4 * 3
        torch.bmm(torch.randn(5, 6, 4), torch.randn(5, 4, 2))  # fp32: 5 * 2 * 6 * 4 * 2
        torch.tanh(a)
    split = profile_update.by_dtype(prof, updates=2)
    assert split["fp32 flop"] == (2 * 6 * 4 * 3 + 5 * 2 * 6 * 4 * 2) / 2
    assert split["bf16 flop"] == 2 * 6 * 4 * 3 / 2
    assert split["fp32"] > 0 and split["bf16"] > 0 and split["other"] > 0
