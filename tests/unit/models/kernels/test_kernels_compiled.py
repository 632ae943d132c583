"""Compiled decoding (seq2seq.models.kernels.compiled): the same losses, gradients and searches as the
eager model with its kernels."""

import pytest
import torch
from torch import Tensor, nn

from seq2seq.data.tokenizer import BOS
from seq2seq.decoding.search import SearchConfig, beam_search, greedy_search
from seq2seq.models.attention import lengths_to_mask
from seq2seq.models.kernels import accelerate
from seq2seq.models.kernels.compiled import CompiledRNN, bucket, chunk_sizes
from seq2seq.models.rnn import RNNSeq2Seq
from seq2seq.models.transformer import TransformerSeq2Seq
from seq2seq.training.losses import batch_loss

V = 30


def tiny_model(seed: int = 0) -> RNNSeq2Seq:
    """Untied output layer with unit-variance weights: peaked distributions, EOS at varied steps."""
    torch.manual_seed(seed)
    model = RNNSeq2Seq(V, emb_size=8, hidden_size=12, dropout=0.0, tie_embeddings=False)
    nn.init.normal_(model.generator.weight, std=1.0)
    return accelerate(model)  # the kernels the compiled loops run, as in training


def tiny_batch(src_lens: list[int], tgt_lens: list[int], seed: int = 1) -> dict[str, Tensor]:
    gen = torch.Generator().manual_seed(seed)
    src_mask, tgt_mask = (
        lengths_to_mask(torch.tensor(src_lens)),
        lengths_to_mask(torch.tensor(tgt_lens)),
    )
    src = torch.randint(4, V, src_mask.shape, generator=gen).masked_fill(~src_mask, 0)  # (B, S)
    tgt_out = torch.randint(4, V, tgt_mask.shape, generator=gen).masked_fill(~tgt_mask, 0)  # (B, T)
    tgt_in = torch.cat([torch.full_like(tgt_out[:, :1], BOS), tgt_out[:, :-1]], 1)  # (B, T)
    return {"src": src, "src_lens": torch.tensor(src_lens), "src_mask": src_mask,
            "tgt_in": tgt_in.masked_fill(~tgt_mask, 0), "tgt_out": tgt_out, "tgt_mask": tgt_mask}  # fmt: skip


def loss_and_grads(
    model: RNNSeq2Seq, runner: object, batch: dict[str, Tensor]
) -> tuple[Tensor, Tensor, list[Tensor]]:
    """Smoothed loss, attention weights and the gradient of every parameter of `model`, run by `runner`."""
    model.zero_grad()
    loss, _, _, weights = batch_loss(runner, batch, 0.1)
    loss.backward()
    return loss.detach(), weights.detach(), [p.grad.clone() for p in model.parameters()]


def assert_same_training(
    model: RNNSeq2Seq, compiled: CompiledRNN, batch: dict[str, Tensor], atol: float = 1e-6
) -> None:
    loss, weights, grads = loss_and_grads(model, model, batch)
    compiled_loss, compiled_weights, compiled_grads = loss_and_grads(model, compiled, batch)
    torch.testing.assert_close(compiled_loss, loss, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(compiled_weights, weights, rtol=1e-5, atol=atol)
    for compiled_grad, grad in zip(compiled_grads, grads, strict=True):
        torch.testing.assert_close(compiled_grad, grad, rtol=1e-4, atol=atol)


def test_bucket_pads_less_than_a_quarter_and_repeats() -> None:
    sizes = [bucket(n) for n in range(1, 1025)]
    for n, size in enumerate(sizes, start=1):
        assert max(n, 8) <= size < max(n, 8) * 1.25
        assert bucket(size) == size  # a bucket is its own bucket: padded shapes repeat
    assert len(set(sizes)) <= 4 * 7 + 1  # four per octave from 8 to 1,024


@pytest.mark.parametrize("chunk", [1, 2, 8, 16])
def test_chunk_sizes_cover_every_step_with_two_graph_sizes(chunk: int) -> None:
    for T in range(0, 70):
        sizes = chunk_sizes(T, chunk)
        assert sum(sizes) == T
        assert set(sizes) <= {chunk, 1}
        assert sizes == sorted(sizes, reverse=True)  # whole chunks first, single steps after
        assert len(sizes) == T // chunk + T % chunk


def test_other_models_and_chunks_are_refused() -> None:
    with pytest.raises(TypeError, match="RNNSeq2Seq"):
        CompiledRNN(TransformerSeq2Seq(V, d_model=16, heads=2, layers=1, ff_size=32))
    with pytest.raises(ValueError, match="power of two"):
        CompiledRNN(tiny_model(), chunk=6)


def test_wrapper_passes_for_the_model_and_stays_itself() -> None:
    model = tiny_model()
    compiled = CompiledRNN(model)
    assert (
        compiled.to("cpu").eval() is compiled and not model.training
    )  # Translator's model.to(d).eval()
    assert compiled.train() is compiled and model.training
    assert compiled.generator is model.generator and compiled.max_len == model.max_len
    assert list(compiled.parameters()) == list(model.parameters())


@pytest.mark.parametrize("buckets", [False, True])
def test_chunked_and_padded_decoding_trains_as_eager(buckets: bool) -> None:
    # The chunks run uncompiled here (the plain loop `_unroll` falls back to), so the chunking, the
    # padding to buckets and the slicing back are checked in milliseconds; inductor's code below.
    model = tiny_model()
    compiled = CompiledRNN(model, chunk=4, buckets=buckets)
    shapes = []

    def unroll(decoder: nn.Module, state: dict[str, Tensor], emb: Tensor) -> tuple:
        shapes.append((*emb.shape[:2], state["src_mask"].size(1)))  # (B', C, S')
        return decoder.unroll(state, emb)

    compiled._compiled["cpu"] = compiled.compiled(torch.device("cpu"))._replace(unroll=unroll)
    # 30 source positions take the eager path's recomputing scorer (over 24); 11 steps: 4, 4, 1, 1, 1.
    assert_same_training(model, compiled, tiny_batch([30, 5, 17], [11, 3, 7]))
    # Padded: 3 rows to 8, 30 positions to 32, 11 steps to 12 (three chunks of 4).
    padded = [(8, 4, 32)] * 3 if buckets else [(3, 4, 30)] * 2 + [(3, 1, 30)] * 3
    assert shapes == padded
    assert_same_training(model, compiled, tiny_batch([9, 4], [4, 2], seed=2))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_cuda_graphs_train_and_search_as_eager() -> None:
    model = tiny_model().cuda()
    compiled = CompiledRNN(model)
    first = {k: v.cuda() for k, v in tiny_batch([7, 5, 3], [6, 2, 5]).items()}
    second = {k: v.cuda() for k, v in tiny_batch([30, 4], [13, 3], seed=2).items()}
    for batch in (first, second, first, second, first):  # warm-up, capture, then replays
        assert_same_training(model, compiled, batch, atol=1e-5)  # GPU kernels sum in other orders
    model.eval()
    args = first["src"], first["src_lens"], first["src_mask"]
    for search, config in [(greedy_search, SearchConfig()), (beam_search, SearchConfig(beam=3))]:
        for _ in range(3):
            assert search(compiled, *args, config).tokens == search(model, *args, config).tokens
