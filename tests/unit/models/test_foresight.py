"""The foresight head (seq2seq.models.foresight): its query has read y_t, the raw attention's has not;
it rebuilds from what a checkpoint keeps; it reads only a GRU translator."""

import pytest
import torch

from seq2seq.data.batching import collate
from seq2seq.models.build import build_model
from seq2seq.models.foresight import (
    ForesightHead,
    foresight_weights,
    head_for,
    translator_states,
)

GRU = {"model": "rnn", "vocab_size": 30, "emb_size": 8, "hidden_size": 12, "dropout": 0.0}


def batch_of(src: list[int], tgt: list[int]) -> dict[str, torch.Tensor]:
    return collate([{"src_ids": src, "tgt_ids": tgt, "index": 0}])


def readings(model, head, src: list[int], tgt: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The raw attention (T, S) and the foresight weights (T, S) of one pair, teacher-forced."""
    batch = batch_of(src, tgt)
    with torch.no_grad():
        _, attention = model(batch["src"], batch["src_lens"], batch["src_mask"], batch["tgt_in"])
        weights, _ = foresight_weights(head, translator_states(model, batch))
    return attention[0], weights[0]


def test_the_foresight_row_of_a_piece_reads_it_and_the_attention_row_does_not() -> None:
    torch.manual_seed(0)
    model = build_model(GRU).eval()
    head = head_for(model).eval()
    src, tgt = [5, 6, 7, 8, 9], [10, 11, 12, 13]
    t = 2  # change y_t (the third target piece) alone
    other = [*tgt[:t], 20, *tgt[t + 1 :]]
    attention, weights = readings(model, head, src, tgt)
    attention2, weights2 = readings(model, head, src, other)
    # Rows up to t of the raw attention are scored with s_0..s_{t-1}, which never read y_t.
    torch.testing.assert_close(attention[: t + 1], attention2[: t + 1])
    # The foresight row t has read y_t; its rows before t have not.
    assert not torch.allclose(weights[t], weights2[t])
    torch.testing.assert_close(weights[:t], weights2[:t])
    assert torch.allclose(weights.sum(-1), torch.ones(len(tgt) + 1))  # rows are distributions


def test_padding_steps_and_positions_get_no_weight() -> None:
    torch.manual_seed(0)
    model = build_model(GRU).eval()
    head = head_for(model).eval()
    batch = collate([{"src_ids": [5, 6, 7], "tgt_ids": [8, 9, 10, 11], "index": 0},
                     {"src_ids": [5], "tgt_ids": [8], "index": 1}])  # fmt: skip
    with torch.no_grad():
        weights, features = foresight_weights(head, translator_states(model, batch))
    assert weights.shape == (2, 5, 4) and features.shape == (2, 5, GRU["emb_size"])
    short = weights[batch["index"].tolist().index(1)]  # (T, S) of the one-word pair
    assert (short[2:] == 0).all() and (short[:, 2:] == 0).all()  # ended steps, padded positions
    assert torch.allclose(short[:2].sum(-1), torch.ones(2))


def test_a_head_rebuilt_from_its_state_reads_the_same() -> None:
    torch.manual_seed(0)
    model = build_model(GRU).eval()
    head = head_for(model, attn_size=6).eval()
    torch.manual_seed(1)
    rebuilt = ForesightHead.from_state(head.state()).eval()
    states = translator_states(model, batch_of([5, 6, 7], [8, 9]))
    with torch.no_grad():
        torch.testing.assert_close(
            foresight_weights(rebuilt, states), foresight_weights(head, states)
        )
    assert rebuilt.sizes == {"hidden_size": 12, "emb_size": 8, "attn_size": 6}


def test_a_transformer_has_no_decoder_states_for_a_head() -> None:
    args = {"model": "transformer", "vocab_size": 30, "d_model": 8, "heads": 2, "layers": 1,
            "ff_size": 16, "dropout": 0.0}  # fmt: skip
    with pytest.raises(ValueError, match="reads a GRU decoder's states; TransformerSeq2Seq"):
        head_for(build_model(args))
