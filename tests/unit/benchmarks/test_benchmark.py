"""The textbook reference equals the fast path; FLOPs per token match PyTorch's counter; the benchmark
scripts refuse what they cannot measure in one line (their quick runs, end to end:
tests/e2e/test_benchmark.py)."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from seq2seq.benchmarks import memory as benchmark_memory
from seq2seq.benchmarks import speed as benchmark
from seq2seq.benchmarks.reference import reference_loss
from seq2seq.data.batching import collate
from seq2seq.models.attention import SCORERS
from seq2seq.models.kernels import accelerate
from seq2seq.models.rnn import RNNSeq2Seq
from seq2seq.models.transformer import TransformerSeq2Seq
from seq2seq.training.config import TrainConfig
from seq2seq.training.losses import batch_loss


def random_batch(vocab: int, lengths: list[tuple[int, int]]) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    items = [
        {"src_ids": torch.randint(4, vocab, (s,), generator=gen).tolist(),
         "tgt_ids": torch.randint(4, vocab, (t,), generator=gen).tolist(), "index": i}
        for i, (s, t) in enumerate(lengths)
    ]  # fmt: skip
    return collate(items)


@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.parametrize("score", SCORERS)
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


@pytest.mark.parametrize("score", SCORERS)
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


@pytest.mark.parametrize("score", SCORERS)
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
     RNNSeq2Seq(50, 16, 32, "additive", attn_size=24, decoder="cgru", dropout=0.0),
     TransformerSeq2Seq(50, 32, heads=4, layers=2, ff_size=64, dropout=0.0, attn_dropout=0.0)],
    ids=["gru-additive", "gru-dot-2-layers", "cgru-additive", "transformer"],
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


def test_bf16_path_is_skipped_on_a_cpu_without_native_bf16() -> None:
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    without, native = {"native_bf16": False, "capability": "AVX2"}, {"native_bf16": True}
    names, skipped = benchmark.path_names(cpu, without, force_bf16=False)
    assert names == ["fast", "compiled", "plain", "reference"]
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
    assert names == ["fast", "compiled", "plain", "reference"] and precisions == ["32-true"]
    assert (
        list(skipped) == ["bf16", "compiled-bf16", "bf16-mixed"] and "AVX2" in skipped["bf16-mixed"]
    )
    everything = (list(benchmark.PATHS), asked, {})
    assert benchmark_memory.plan(benchmark, cpu, without, asked, True) == everything
    assert benchmark_memory.plan(benchmark, cpu, native, asked, False) == everything
    assert benchmark_memory.plan(benchmark, gpu, None, asked, False) == everything


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal needs a machine without CUDA")
@pytest.mark.parametrize("script", [benchmark, benchmark_memory])
def test_device_cuda_without_cuda_is_refused_in_one_line(script, capsys) -> None:
    assert script.main(["--device", "cuda", "--quick"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: --device cuda") and "CUDA" in err


@pytest.mark.parametrize("script", [benchmark, benchmark_memory])
def test_a_json_that_cannot_be_written_is_refused_before_the_runs(
    script, tmp_path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    def no_run(*args: object) -> None:
        raise AssertionError("the benchmark ran before --json was checked")

    monkeypatch.setattr(script, "run", no_run)
    (tmp_path / "a-file").write_text("")
    for json_path, message in ((tmp_path, "a folder, not a file"),
                               (tmp_path / "a-file" / "x.json", "is a file, not a folder")):  # fmt: skip
        assert script.main(["--quick", "--json", str(json_path)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert (
            len(err) == 1
            and err[0].startswith(f"error: --json {json_path}: ")
            and message in err[0]
        )
    assert [p.name for p in tmp_path.iterdir()] == ["a-file"]


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
