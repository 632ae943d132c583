"""Guided alignment in training runs: a tiny run whose attention follows its training links, a
Transformer's chosen head kept in its checkpoint; and under inductor, the gradients of eager."""

import contextlib
from pathlib import Path

import torch

from seq2seq.alignment.words import alignment_error_rate
from seq2seq.commands import train as train_command
from seq2seq.decoding.translator import Translator
from seq2seq.models.kernels.compiled import CompiledRNN
from tests.conftest import tiny_train_args
from tests.unit.training.test_guided import (
    _guided_gradients_of,
    _tiny_rnn,
    lexicon_links,
    write_links,
)


def test_a_guided_run_aligns_far_better_than_an_unguided_one(
    tiny_corpus: Path, tmp_path: Path
) -> None:
    links = write_links(tiny_corpus, "guided-run.align")
    de = (tiny_corpus / "train.de").read_text("utf-8").splitlines()[:100]
    en = (tiny_corpus / "train.en").read_text("utf-8").splitlines()[:100]
    gold = [(set(lexicon_links(s)), set(lexicon_links(s))) for s in de]
    aer = {}
    for name, flags in [
        ("plain", []),
        ("guided", ["--guided-alignment", str(links), "--guided-alignment-weight", "1"]),
    ]:
        args = tiny_train_args(
            tiny_corpus, tmp_path / "runs", "--max-steps", "80", "--val-every", "80",
            "--lr", "1e-2", "--warmup-steps", "5", "--dropout", "0", "--run-name", name, *flags,
        )  # fmt: skip
        with contextlib.chdir(tmp_path):
            assert train_command.main(args) == 0
        run = tmp_path / "runs" / name / "version_0"
        translator = Translator.load(run / "checkpoints" / "last.ckpt")
        found = [r.word_alignment for r in translator.align(de, en)]
        aer[name] = alignment_error_rate(found, gold).aer
        events = next(run.glob("events.out.tfevents.*")).read_bytes()
        assert (b"train/align_loss" in events) == (name == "guided")
    assert aer["guided"] < aer["plain"] - 0.2, aer  # measured: 0.46 against 0.83


def test_inductor_decoding_trains_guidance_as_eager() -> None:
    model = _tiny_rnn()
    eager, compiled = _guided_gradients_of(model, [model, CompiledRNN(model)])  # ~11 s compiling
    assert len(eager) == len(compiled) > 0
    for want, got in zip(eager, compiled, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_a_guided_transformer_run_keeps_its_head_in_the_checkpoint(
    tiny_corpus: Path, tmp_path: Path
) -> None:
    links = write_links(tiny_corpus, "transformer-run.align")
    args = tiny_train_args(
        tiny_corpus, tmp_path / "runs", "--model", "transformer", "--d-model", "16",
        "--heads", "2", "--layers", "2", "--ff-size", "32", "--max-steps", "4", "--val-every", "4",
        "--alignment-layer", "0", "--alignment-heads", "1", "--guided-alignment", str(links),
        "--guided-alignment-cost", "mse",
    )  # fmt: skip
    with contextlib.chdir(tmp_path):
        assert train_command.main(args) == 0
    run = tmp_path / "runs" / "transformer" / "version_0"
    checkpoint = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["model_args"]["alignment_layer"] == 0
    assert checkpoint["model_args"]["alignment_heads"] == 1
    assert Translator.load(run / "checkpoints" / "last.ckpt").model.alignment_head == 1
    assert b"train/align_loss" in next(run.glob("events.out.tfevents.*")).read_bytes()
