"""The GRU translator's kernels (seq2seq.models.kernels: the deferred decoder steps, rows that stop
stepping, the unpacked encoder, the recurrence in fp32) against the textbook modules of
seq2seq.models.rnn, in outputs and gradients."""

import copy

import pytest
import torch

from seq2seq.models.attention import SCORERS, lengths_to_mask, masked_softmax
from seq2seq.models.kernels import accelerate
from seq2seq.models.kernels import decoder as kernel_decoder
from seq2seq.models.kernels.decoder import DeferredBahdanauDecoder, Fp32RecurrenceRNN
from seq2seq.models.rnn import DECODERS, RNNSeq2Seq


def tiny_model(score: str = "additive", **kwargs) -> RNNSeq2Seq:
    """A textbook model, in eval mode, dropout 0."""
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


@pytest.mark.parametrize("decoder", DECODERS)
@pytest.mark.parametrize("score", SCORERS)
def test_rows_stop_stepping_when_their_target_ends_and_nothing_real_changes(
    score: str, decoder: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = tiny_model(score, decoder=decoder)
    model = accelerate(copy.deepcopy(plain))
    src, src_lens, src_mask = tiny_batch()[:3]
    tgt_mask = lengths_to_mask(torch.tensor([6, 4, 1]), 6)  # longest first, as collate orders rows
    tgt_in = torch.randint(4, 30, (3, 6)).masked_fill(~tgt_mask, 0)
    rows: list[int] = []

    def softmax(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        rows.append(len(scores))  # each step's rows, as the CPU's training steps see them
        return masked_softmax(scores, mask)

    monkeypatch.setattr("seq2seq.models.kernels.decoder.masked_softmax", softmax)

    def run(order: torch.Tensor, model: RNNSeq2Seq = model) -> tuple[torch.Tensor, ...]:
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
    rows.clear()
    textbook = run(torch.arange(3), plain)  # every row steps to the end, through the modules
    assert rows == []
    for got, want, truth in zip(in_order, shuffled, textbook, strict=True):
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(got, truth)


@pytest.mark.parametrize("decoder", DECODERS)
@pytest.mark.parametrize("score", SCORERS)
@pytest.mark.parametrize("ordered", [True, False])
@pytest.mark.parametrize("attention_only", [False, True])
def test_training_steps_equal_the_modules_in_outputs_and_gradients(
    score: str, decoder: str, ordered: bool, attention_only: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a CPU with gradients the steps run through seq2seq.models.kernels.deferred; nn.GRUCell and the
    scorer's module are the truth. A loss of the attention alone (guided alignment's) leaves the
    last step's state out of it (and with `cgru`, the last step's GRU2)."""
    model = accelerate(tiny_model(score, decoder=decoder)).train()  # dropout 0: both draw nothing
    src, src_lens, src_mask = tiny_batch()[:3]
    tgt_lens = torch.tensor([6, 4, 1] if ordered else [4, 6, 1])  # rows that end early, or not
    tgt_mask = lengths_to_mask(tgt_lens, 6)  # (B, T)
    tgt_in = torch.randint(4, 30, (3, 6)).masked_fill(~tgt_mask, 0)
    calls: list[int] = []
    for cell in model.decoder.modules():
        if isinstance(cell, torch.nn.GRUCell):  # Bahdanau's one, cgru's two
            cell.register_forward_hook(lambda module, args, out: calls.append(len(out)))
    results = []
    # Deterministic mode fills what torch.empty returns with NaN: a gradient that reads memory no
    # step wrote shows.
    monkeypatch.setattr(torch.utils.deterministic, "fill_uninitialized_memory", True)
    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        for deferred in (True, False):
            if not deferred:  # every step through nn.GRUCell, as on a GPU
                monkeypatch.setattr(kernel_decoder, "steps_deferred", lambda like: False)
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
    if decoder == "cgru":
        assert {"decoder.query_cell.weight_ih", "decoder.query_cell.bias_ih"} <= our_grads.keys()
    for name, want in true_grads.items():
        torch.testing.assert_close(our_grads[name], want, msg=name)


@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("hidden", [12, 40])  # a direction's 6 or 20 against the embedding's 8
def test_cpu_encoder_equals_the_packed_gru_in_outputs_and_gradients(
    layers: int, hidden: int
) -> None:
    """On a CPU each direction runs over the padded batch; nn.GRU over packed sequences is the truth."""
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

    torch.manual_seed(0)
    model = RNNSeq2Seq(30, emb_size=8, hidden_size=hidden, dropout=0.0, enc_layers=layers)
    encoder = accelerate(model).encoder.train()  # dropout 0: both paths draw nothing
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


def test_the_recurrence_leaves_cpu_autocast_and_the_textbook_does_not() -> None:
    plain = tiny_model()
    model = accelerate(copy.deepcopy(plain))
    assert isinstance(model, Fp32RecurrenceRNN) and isinstance(
        model.decoder, DeferredBahdanauDecoder
    )
    src, src_lens, src_mask, tgt_in = tiny_batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        kept = model.encode(src, src_lens, src_mask)
        cast = plain.encode(src, src_lens, src_mask)
        logits, _, _ = model.step(kept, tgt_in[:, 0])
    assert kept["enc_out"].dtype == kept["dec_state"].dtype == logits.dtype == torch.float32
    assert cast["dec_state"].dtype == torch.bfloat16  # the bridge's matmul, autocast
