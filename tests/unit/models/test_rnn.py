"""The GRU translator (seq2seq.models.rnn): its invariants hold, with each decoder, as the textbook
writes it and with the kernels plugged in (seq2seq.models.kernels; tests/unit/models/kernels/test_kernels_rnn.py compares the two)."""

import pytest
import torch

from seq2seq.models.attention import SCORERS, AdditiveScorer, lengths_to_mask
from seq2seq.models.kernels import accelerate
from seq2seq.models.rnn import DECODERS, RNNSeq2Seq


def tiny_model(score: str = "additive", kernels: bool = False, **kwargs) -> RNNSeq2Seq:
    torch.manual_seed(0)
    model = RNNSeq2Seq(
        vocab_size=30, emb_size=8, hidden_size=12, score=score, dropout=0.0, **kwargs
    )
    return (accelerate(model) if kernels else model).eval()


def tiny_batch() -> tuple[torch.Tensor, ...]:
    torch.manual_seed(1)
    src_lens = torch.tensor([5, 3, 1])
    src_mask = lengths_to_mask(src_lens, 5)  # (B, S)
    src = torch.randint(4, 30, (3, 5)).masked_fill(~src_mask, 0)
    tgt_in = torch.randint(4, 30, (3, 4))
    return src, src_lens, src_mask, tgt_in


@pytest.mark.parametrize("decoder", DECODERS)
@pytest.mark.parametrize("kernels", [False, True])
@pytest.mark.parametrize("score", SCORERS)
def test_shapes(score: str, kernels: bool, decoder: str) -> None:
    model = tiny_model(score, kernels, decoder=decoder)
    src, src_lens, src_mask, tgt_in = tiny_batch()
    logits, weights = model(src, src_lens, src_mask, tgt_in)
    assert logits.shape == (3, 4, 30)
    assert weights.shape == (3, 4, 5)
    state = model.encode(src, src_lens, src_mask)
    assert state["enc_out"].shape == (3, 5, 12)  # encoder output size == decoder hidden size
    assert (state["enc_out"][~src_mask] == 0).all()


@pytest.mark.parametrize("decoder", DECODERS)
@pytest.mark.parametrize("kernels", [False, True])
@pytest.mark.parametrize("score", SCORERS)
def test_teacher_forcing_equals_step_by_step_unroll(
    score: str, kernels: bool, decoder: str
) -> None:
    model = tiny_model(score, kernels, decoder=decoder)
    src, src_lens, src_mask, tgt_in = tiny_batch()
    logits, weights = model(src, src_lens, src_mask, tgt_in)
    state = model.encode(src, src_lens, src_mask)
    for t in range(tgt_in.size(1)):
        step_logits, step_weights, state = model.step(state, tgt_in[:, t])
        torch.testing.assert_close(step_logits, logits[:, t])
        torch.testing.assert_close(step_weights, weights[:, t])


@pytest.mark.parametrize("decoder", DECODERS)
@pytest.mark.parametrize("kernels", [False, True])
@pytest.mark.parametrize("score", SCORERS)
def test_padding_beyond_length_changes_nothing(score: str, kernels: bool, decoder: str) -> None:
    model = tiny_model(score, kernels, decoder=decoder, enc_layers=2)
    src, src_lens, src_mask, tgt_in = tiny_batch()
    logits, weights = model(src, src_lens, src_mask, tgt_in)
    noisy = src.masked_fill(~src_mask, 7)  # other ids in the padded positions
    longer = torch.cat([noisy, torch.full((3, 2), 9)], dim=1)  # and two more padded columns
    logits2, weights2 = model(longer, src_lens, lengths_to_mask(src_lens, 7), tgt_in)
    torch.testing.assert_close(logits2, logits)
    torch.testing.assert_close(weights2[..., :5], weights)
    assert (weights2[..., 5:] == 0).all()


@pytest.mark.parametrize("kernels", [False, True])
def test_keys_are_projected_once_per_batch(kernels: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    model = tiny_model("additive", kernels)
    calls = []
    scorer = type(model.decoder.scorer)  # AdditiveScorer or its kernel
    assert issubclass(scorer, AdditiveScorer)
    original = scorer.project_keys
    monkeypatch.setattr(
        scorer, "project_keys", lambda self, keys: calls.append(1) or original(self, keys)
    )
    src, src_lens, src_mask, tgt_in = tiny_batch()
    model(src, src_lens, src_mask, tgt_in)  # four decoder steps
    assert len(calls) == 1


def test_tied_embeddings_share_one_matrix() -> None:
    model = tiny_model(tie_embeddings=True)
    assert model.generator.weight is model.encoder.embedding.weight
    assert model.decoder.embedding is model.encoder.embedding
    untied = tiny_model(tie_embeddings=False)
    assert untied.generator.weight is not untied.decoder.embedding.weight


def test_odd_hidden_size_is_refused() -> None:
    with pytest.raises(ValueError, match="even"):
        RNNSeq2Seq(vocab_size=10, emb_size=4, hidden_size=7)
