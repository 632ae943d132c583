"""Compiled decoding (seq2seq.models.kernels.compiled) under inductor: the same losses, gradients and
searches as the eager model with its kernels (chunks and buckets without inductor are unit tests:
tests/unit/models/kernels/test_kernels_compiled.py)."""

import torch

from seq2seq.data.tokenizer import EOS
from seq2seq.decoding.search import SearchConfig, beam_search, greedy_search
from seq2seq.models.kernels.compiled import CompiledRNN
from tests.unit.models.kernels.test_kernels_compiled import (
    assert_same_training,
    tiny_batch,
    tiny_model,
)


def test_inductor_decoding_trains_as_eager() -> None:
    model = tiny_model()
    compiled = CompiledRNN(model)  # one step a graph on the CPU: chunking is a unit test
    assert_same_training(model, compiled, tiny_batch([7, 5, 3], [5, 2, 4]))
    assert_same_training(
        model, compiled, tiny_batch([9, 30, 4, 2], [3, 2, 1, 3], seed=2)
    )  # new sizes


def test_inductor_search_finds_what_eager_finds() -> None:
    model = tiny_model(seed=3).eval()
    with torch.no_grad():
        model.generator.bias[EOS] = 0.5  # sentences end at different steps: beam rows shrink
    compiled = CompiledRNN(model)
    batch = tiny_batch([7, 5, 3, 1, 6], [1] * 5, seed=4)
    args = batch["src"], batch["src_lens"], batch["src_mask"]
    for search, config in [(greedy_search, SearchConfig()), (beam_search, SearchConfig(beam=3))]:
        expected, found = search(model, *args, config), search(compiled, *args, config)
        assert found.tokens == expected.tokens
        torch.testing.assert_close(found.scores, expected.scores, rtol=1e-4, atol=1e-4)
        for got, want in zip(found.weights, expected.weights, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
