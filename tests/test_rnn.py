import pytest
import torch

from seq2seq.models.attention import AdditiveScorer, lengths_to_mask, masked_softmax
from seq2seq.models.rnn import RNNSeq2Seq

SCORERS = ["additive", "dot", "scaled"]


def tiny_model(score: str = "additive", **kwargs) -> RNNSeq2Seq:
    torch.manual_seed(0)
    return RNNSeq2Seq(
        vocab_size=30, emb_size=8, hidden_size=12, score=score, dropout=0.0, **kwargs
    ).eval()


def tiny_batch() -> tuple[torch.Tensor, ...]:
    torch.manual_seed(1)
    src_lens = torch.tensor([5, 3, 1])
    src_mask = lengths_to_mask(src_lens, 5)  # (B, S)
    src = torch.randint(4, 30, (3, 5)).masked_fill(~src_mask, 0)
    tgt_in = torch.randint(4, 30, (3, 4))
    return src, src_lens, src_mask, tgt_in


@pytest.mark.parametrize("score", SCORERS)
def test_shapes(score: str) -> None:
    model = tiny_model(score)
    src, src_lens, src_mask, tgt_in = tiny_batch()
    logits, weights = model(src, src_lens, src_mask, tgt_in)
    assert logits.shape == (3, 4, 30)
    assert weights.shape == (3, 4, 5)
    state = model.encode(src, src_lens, src_mask)
    assert state["enc_out"].shape == (3, 5, 12)  # encoder output size == decoder hidden size
    assert (state["enc_out"][~src_mask] == 0).all()


@pytest.mark.parametrize("score", SCORERS)
def test_teacher_forcing_equals_step_by_step_unroll(score: str) -> None:
    model = tiny_model(score)
    src, src_lens, src_mask, tgt_in = tiny_batch()
    logits, weights = model(src, src_lens, src_mask, tgt_in)
    state = model.encode(src, src_lens, src_mask)
    for t in range(tgt_in.size(1)):
        step_logits, step_weights, state = model.step(state, tgt_in[:, t])
        torch.testing.assert_close(step_logits, logits[:, t])
        torch.testing.assert_close(step_weights, weights[:, t])


@pytest.mark.parametrize("score", SCORERS)
def test_padding_beyond_length_changes_nothing(score: str) -> None:
    model = tiny_model(score, enc_layers=2)
    src, src_lens, src_mask, tgt_in = tiny_batch()
    logits, weights = model(src, src_lens, src_mask, tgt_in)
    noisy = src.masked_fill(~src_mask, 7)  # other ids in the padded positions
    longer = torch.cat([noisy, torch.full((3, 2), 9)], dim=1)  # and two more padded columns
    logits2, weights2 = model(longer, src_lens, lengths_to_mask(src_lens, 7), tgt_in)
    torch.testing.assert_close(logits2, logits)
    torch.testing.assert_close(weights2[..., :5], weights)
    assert (weights2[..., 5:] == 0).all()


@pytest.mark.parametrize("score", SCORERS)
def test_rows_stop_stepping_when_their_target_ends_and_nothing_real_changes(
    score: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tiny_model(score)
    src, src_lens, src_mask = tiny_batch()[:3]
    tgt_mask = lengths_to_mask(torch.tensor([6, 4, 1]), 6)  # longest first, as collate orders rows
    tgt_in = torch.randint(4, 30, (3, 6)).masked_fill(~tgt_mask, 0)
    rows: list[int] = []

    def softmax(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        rows.append(len(scores))  # each step's rows, as the CPU's training steps see them
        return masked_softmax(scores, mask)

    monkeypatch.setattr("seq2seq.models.rnn.masked_softmax", softmax)

    def run(order: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Features, weights and gradients of the rows in `order`, put back in the batch's order."""
        model.zero_grad()
        state = model.encode(src[order], src_lens[order], src_mask[order])
        features, weights = model.decode(state, tgt_in[order])  # (B, T, E), (B, T, S)
        (features[tgt_mask[order]] ** 2).sum().backward()  # real positions only, as the loss
        back = order.argsort()
        grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]  # no generator
        return features[back][tgt_mask], weights[back], *grads

    in_order = run(torch.arange(3))
    assert rows == [3, 2, 2, 2, 1, 1]  # steps 2-6 skip the row of one step, 5-6 that of four
    rows.clear()
    shuffled = run(torch.tensor([2, 0, 1]))  # rows out of order: each steps to the end
    assert rows == [3] * 6
    assert (in_order[1][~tgt_mask] == 0).all()  # padding steps have no attention, either way
    for got, want in zip(in_order, shuffled, strict=True):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("score", SCORERS)
@pytest.mark.parametrize("ordered", [True, False])
@pytest.mark.parametrize("attention_only", [False, True])
def test_training_steps_equal_the_modules_in_outputs_and_gradients(
    score: str, ordered: bool, attention_only: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a CPU with gradients the steps run through seq2seq.models.deferred; nn.GRUCell and the
    scorer's module are the truth. A loss of the attention alone (guided alignment's) leaves the
    last step's state out of it."""
    model = tiny_model(score).train()  # dropout 0: both paths draw nothing
    src, src_lens, src_mask = tiny_batch()[:3]
    tgt_lens = torch.tensor([6, 4, 1] if ordered else [4, 6, 1])  # rows that end early, or not
    tgt_mask = lengths_to_mask(tgt_lens, 6)  # (B, T)
    tgt_in = torch.randint(4, 30, (3, 6)).masked_fill(~tgt_mask, 0)
    calls: list[int] = []
    model.decoder.cell.register_forward_hook(lambda module, args, out: calls.append(len(out)))
    results = []
    # Deterministic mode fills what torch.empty returns with NaN: a gradient that reads memory no
    # step wrote shows.
    monkeypatch.setattr(torch.utils.deterministic, "fill_uninitialized_memory", True)
    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        for deferred in (True, False):
            if not deferred:  # every step through nn.GRUCell, as on a GPU
                monkeypatch.setattr("seq2seq.models.rnn._steps_deferred", lambda like: False)
            model.zero_grad()
            state = model.encode(src, src_lens, src_mask)
            features, weights = model.decode(state, tgt_in)  # (B, T, E), (B, T, S)
            loss = (weights * torch.arange(5.0)).sum()
            if not attention_only:
                ramp = torch.linspace(-1, 1, features.numel()).view_as(features)
                loss = loss + (features * ramp).sum()
            loss.backward()
            grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
            results.append((features.detach(), weights.detach(), grads))
            assert bool(calls) != deferred  # the cell module ran only without the deferred path
    finally:
        torch.use_deterministic_algorithms(deterministic)
    (ours, our_weights, our_grads), (truth, true_weights, true_grads) = results
    torch.testing.assert_close(ours, truth)
    torch.testing.assert_close(our_weights, true_weights)
    assert our_grads.keys() == true_grads.keys()
    assert {"decoder.cell.weight_ih", "decoder.cell.bias_hh"} <= our_grads.keys()
    for name, want in true_grads.items():
        torch.testing.assert_close(our_grads[name], want, msg=name)


def test_keys_are_projected_once_per_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    model = tiny_model("additive")
    calls = []
    original = AdditiveScorer.project_keys
    monkeypatch.setattr(
        AdditiveScorer, "project_keys", lambda self, keys: calls.append(1) or original(self, keys)
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


@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("hidden", [12, 40])  # a direction's 6 or 20 against the embedding's 8
def test_cpu_encoder_equals_the_packed_gru_in_outputs_and_gradients(
    layers: int, hidden: int
) -> None:
    """On a CPU each direction runs over the padded batch; nn.GRU over packed sequences is the truth."""
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

    torch.manual_seed(0)
    model = RNNSeq2Seq(30, emb_size=8, hidden_size=hidden, dropout=0.0, enc_layers=layers)
    encoder = model.encoder.train()  # dropout 0: both paths draw nothing
    src, src_lens = tiny_batch()[:2]
    src = torch.cat([src, torch.zeros(3, 2, dtype=torch.long)], dim=1)  # more padding at the end
    results = []
    for packed in (False, True):
        encoder.zero_grad()
        if packed:
            emb = encoder.embedding(src)  # (B, S, E)
            seqs = pack_padded_sequence(emb, src_lens, batch_first=True, enforce_sorted=False)
            out = pad_packed_sequence(encoder.rnn(seqs)[0], batch_first=True, total_length=7)[0]
        else:
            out = encoder(src, src_lens)  # (B, S, H)
        (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        grads = [p.grad.clone() for p in encoder.parameters()]
        results.append((out.detach(), grads))
    (ours, our_grads), (truth, true_grads) = results
    assert (ours[~lengths_to_mask(src_lens, 7)] == 0).all()
    torch.testing.assert_close(ours, truth)
    for got, want in zip(our_grads, true_grads, strict=True):
        torch.testing.assert_close(got, want)
