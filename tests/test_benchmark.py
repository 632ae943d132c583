"""The textbook reference path equals the fast path; scripts/benchmark.py writes every figure."""

import json

import pytest
import torch

from seq2seq.data import collate
from seq2seq.reference import reference_loss, textbook_loader
from seq2seq.rnn import RNNSeq2Seq
from seq2seq.system import batch_loss
from tests.conftest import load_script

benchmark = load_script("benchmark")


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
    torch.manual_seed(0)
    model = RNNSeq2Seq(40, emb_size=8, hidden_size=12, score=score, attn_size=10, dropout=0.0,
                       tie_embeddings=tie)  # fmt: skip
    # Uneven lengths on both sides: padding in the source, the target, and the longest of each apart.
    batch = random_batch(40, [(6, 3), (2, 9), (11, 5), (4, 4)])
    grads = []
    for loss_fn in (batch_loss, reference_loss):
        model.zero_grad()
        loss_sum, nll_sum, tokens = loss_fn(model, batch, 0.1)[:3]
        (loss_sum / tokens).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        grads[-1]["_sums"] = torch.stack([loss_sum.detach(), nll_sum, tokens.float()])
    fast, ref = grads
    assert fast.keys() == ref.keys()
    for name in fast:
        torch.testing.assert_close(fast[name], ref[name], rtol=1e-4, atol=1e-6, msg=name)


def test_textbook_loader_gives_random_fixed_size_batches(
    tiny_corpus, tmp_path, monkeypatch
) -> None:
    from seq2seq.data import TranslationDataModule

    monkeypatch.chdir(tmp_path)
    dm = TranslationDataModule(data_dir=str(tiny_corpus), vocab_size=100, batch_tokens=400)
    dm.prepare_data()
    dm.setup("fit")
    batches = list(textbook_loader(dm.datasets["train"], 16, max_len=100, seed=1))
    assert [b["src"].size(0) for b in batches[:-1]] == [16] * (len(batches) - 1)
    order = torch.cat([b["index"] for b in batches])
    assert sorted(order.tolist()) == list(range(len(dm.datasets["train"])))
    assert order.tolist() != sorted(order.tolist())  # shuffled, not length-sorted


@pytest.mark.parametrize("score", ["additive", "dot", "scaled"])
def test_bf16_autocast_path_computes_nearly_the_same_loss(score: str) -> None:
    torch.manual_seed(0)
    model = RNNSeq2Seq(40, emb_size=16, hidden_size=32, score=score, dropout=0.0)
    batch = random_batch(40, [(6, 3), (2, 9), (11, 5), (4, 4)])
    fp32 = batch_loss(model, batch, 0.1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        bf16 = batch_loss(model, batch, 0.1)
    assert bf16[0].dtype == torch.float32  # the loss itself is reduced in fp32
    torch.testing.assert_close(bf16[0], fp32[0], rtol=0.02, atol=0.0)
    assert not torch.equal(bf16[0], fp32[0])  # it did run in bf16


@pytest.mark.slow
def test_quick_benchmark_writes_every_figure(tiny_corpus, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)  # the data cache goes to ./data/cache
    out = tmp_path / "bench.json"
    argv = ["--quick", "--data-dir", str(tiny_corpus), "--vocab-size", "100", "--emb-size", "16",
            "--hidden-size", "32", "--batch-tokens", "400", "--threads", "1", "--json", str(out)]  # fmt: skip
    assert benchmark.main(argv) == 0
    result = json.loads(out.read_text())
    for path in ("fast", "bf16", "reference"):
        for key in ("tokens_per_sec", "sec_per_update", "useful_gflops", "matmul_fraction",
                    "mflop_per_token", "peak_rss_mb", "rss_before_training_mb"):  # fmt: skip
            assert result[path][key] > 0, (path, key)
    assert result["matmul_gflops"] > 0 and result["speedup"] > 0 and result["speedup_bf16"] > 0
    for key in ("greedy_sent_per_sec", "beam5_sent_per_sec", "greedy_bleu", "beam5_bleu"):
        assert result["decode"][key] >= 0, key
    assert result["callback"]["every_n_steps"] == 500 and result["callback"]["overhead"] > 0
    table = capsys.readouterr().out
    assert "tokens/s" in table and "beam-5" in table and "callback" in table and "bf16" in table
    assert result["device"]["type"] == "cpu" and result["left_out"] == {}
    assert result["bf16"]["matmul_fraction_of"] == "fp32" and result["matmul_bf16_gflops"] is None
    # The table of a CUDA run (not runnable here): its own rate and memory rows, no RSS.
    result["device"] = {"type": "cuda", "name": "GPU", "cuda": "12.8", "cudnn": 91000, "torch": "2",
                        "float32_matmul_precision": "highest", "cudnn_rnn_fp32_precision": "tf32",
                        "bf16_autocast_encoder_dtype": "float16"}  # fmt: skip
    result["matmul_bf16_gflops"] = 2 * result["matmul_gflops"]
    for path in ("fast", "bf16", "reference"):
        result[path]["peak_gpu_mb"] = result[path].pop("peak_rss_mb")
    gpu = benchmark.table(result)
    assert "bf16 col.: bf16" in gpu and "peak GPU memory" in gpu and "cuDNN 91000" in gpu
    assert "RSS probes are skipped" in gpu and "peak RSS" not in gpu


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal needs a machine without CUDA")
def test_device_cuda_without_cuda_is_refused_in_one_line(capsys) -> None:
    assert benchmark.main(["--device", "cuda", "--quick"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: --device cuda") and "CUDA" in err
