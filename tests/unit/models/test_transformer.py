import pytest
import torch
import torch.nn.functional as F

from seq2seq.models.attention import lengths_to_mask
from seq2seq.models.build import build_model, model_args_from
from seq2seq.models.interface import reorder_state
from seq2seq.models.transformer import TransformerSeq2Seq
from seq2seq.training.config import TrainConfig

V, H, N = 30, 16, 4
LN = [pytest.param(False, id="pre-ln"), pytest.param(True, id="post-ln")]


def tiny_model(post_ln: bool = False, **kwargs) -> TransformerSeq2Seq:
    torch.manual_seed(0)
    sizes = dict(d_model=H, heads=N, layers=2, ff_size=32, dropout=0.0, attn_dropout=0.0)
    return TransformerSeq2Seq(V, post_ln=post_ln, **{**sizes, **kwargs}).eval()


def tiny_batch() -> tuple[torch.Tensor, ...]:
    torch.manual_seed(1)
    src_lens = torch.tensor([5, 3, 1])
    src_mask = lengths_to_mask(src_lens, 5)  # (B, S)
    src = torch.randint(4, V, (3, 5)).masked_fill(~src_mask, 0)
    tgt_in = torch.randint(4, V, (3, 4))
    return src, src_lens, src_mask, tgt_in


def test_shapes_and_state() -> None:
    model = tiny_model()
    src, src_lens, src_mask, tgt_in = tiny_batch()
    logits, weights = model(src, src_lens, src_mask, tgt_in)
    assert logits.shape == (3, 4, V) and weights.shape == (3, 4, N, 5)
    state = model.encode(src, src_lens, src_mask)
    assert state["cross_k1"].shape == (3, N, 5, H // N) and state["self_v0"].shape == (
        3,
        N,
        0,
        H // N,
    )
    assert state["pos"].shape == (3,)
    step_logits, step_weights, state = model.step(state, tgt_in[:, 0])
    assert step_logits.shape == (3, V) and step_weights.shape == (3, N, 5)
    assert state["self_k1"].shape == (3, N, 1, H // N) and state["pos"].tolist() == [1, 1, 1]


@pytest.mark.parametrize("post_ln", LN)
def test_future_targets_do_not_change_earlier_outputs(post_ln: bool) -> None:
    model = tiny_model(post_ln)
    src, src_lens, src_mask, tgt_in = tiny_batch()
    logits, weights = model(src, src_lens, src_mask, tgt_in)
    changed = tgt_in.clone()
    changed[:, 2:] = torch.randint(4, V, (3, 2))
    logits2, weights2 = model(src, src_lens, src_mask, changed)
    torch.testing.assert_close(logits2[:, :2], logits[:, :2])
    torch.testing.assert_close(weights2[:, :2], weights[:, :2])
    assert not torch.allclose(logits2[:, 2:], logits[:, 2:])


@pytest.mark.parametrize("post_ln", LN)
def test_source_padding_changes_nothing(post_ln: bool) -> None:
    model = tiny_model(post_ln)
    src, src_lens, src_mask, tgt_in = tiny_batch()
    logits, weights = model(src, src_lens, src_mask, tgt_in)
    noisy = src.masked_fill(~src_mask, 7)  # other ids in the padded positions
    longer = torch.cat([noisy, torch.full((3, 2), 9)], dim=1)  # and two more padded columns
    logits2, weights2 = model(longer, src_lens, lengths_to_mask(src_lens, 7), tgt_in)
    torch.testing.assert_close(logits2, logits)
    torch.testing.assert_close(weights2[..., :5], weights)
    assert (weights2[..., 5:] == 0).all()


@pytest.mark.parametrize("post_ln", LN)
def test_step_by_step_equals_teacher_forcing(post_ln: bool) -> None:
    model = tiny_model(post_ln)
    src, src_lens, src_mask, tgt_in = tiny_batch()
    logits, weights = model(src, src_lens, src_mask, tgt_in)
    state = model.encode(src, src_lens, src_mask)
    for t in range(tgt_in.size(1)):
        step_logits, step_weights, state = model.step(state, tgt_in[:, t])
        torch.testing.assert_close(step_logits, logits[:, t])
        torch.testing.assert_close(step_weights, weights[:, t])
    assert state["self_k0"].size(2) == tgt_in.size(1)


def test_reordered_state_decodes_the_reordered_batch() -> None:
    model = tiny_model()
    src, src_lens, src_mask, tgt_in = tiny_batch()
    order = torch.tensor([2, 0, 0, 1])  # beam search repeats and permutes rows
    logits, _ = model(src[order], src_lens[order], src_mask[order], tgt_in[order])
    state = model.encode(src, src_lens, src_mask)
    _, _, state = model.step(state, tgt_in[:, 0])
    state = reorder_state(state, order)  # caches, cross keys, mask and positions all follow
    for t in range(1, tgt_in.size(1)):
        step_logits, _, state = model.step(state, tgt_in[order, t])
        torch.testing.assert_close(step_logits, logits[:, t])


def test_tied_embeddings_share_one_matrix() -> None:
    tied, untied = tiny_model(), tiny_model(tie_embeddings=False)
    assert tied.generator.weight is tied.src_embedding.weight is tied.tgt_embedding.weight
    assert untied.src_embedding.weight is not untied.tgt_embedding.weight
    n_tied = sum(p.numel() for p in tied.parameters())
    assert sum(p.numel() for p in untied.parameters()) == n_tied + 2 * V * H


def test_build_model_reads_the_config_and_keeps_only_model_arguments() -> None:
    cfg = TrainConfig(model="transformer", d_model=H, heads=2, layers=1, ff_size=24, post_ln=True)
    args = model_args_from(cfg, vocab_size=V)
    model = build_model(args)
    assert isinstance(model, TransformerSeq2Seq)
    assert len(model.encoder) == len(model.decoder) == 1 and model.heads == 2
    assert model.decoder[0].ff[0].out_features == 24 and model.decoder[0].post_ln
    assert model.model_args == args and args["vocab_size"] == V
    # Run control (log folder, devices, steps) is not the model's: it stays out of model_args.
    assert not {"log_dir", "devices", "max_steps", "lr", "score"} & args.keys()
    # The same arguments rebuild a model of the same parameter shapes.
    rebuilt = build_model(args)
    shapes = {k: v.shape for k, v in model.state_dict().items()}
    assert {k: v.shape for k, v in rebuilt.state_dict().items()} == shapes


def test_overfits_a_reverse_task() -> None:
    """Proof of life: a tiny Transformer learns to reverse a handful of random sentences."""
    torch.manual_seed(0)
    model = TransformerSeq2Seq(
        V, d_model=32, heads=2, layers=2, ff_size=64, dropout=0.0, attn_dropout=0.0
    )
    src_lens = torch.tensor([6, 5, 6, 4, 6, 3, 5, 6])
    src_mask = lengths_to_mask(src_lens, 6)  # (B, S)
    src = torch.randint(4, V, (8, 6)).masked_fill(~src_mask, 0)
    tgt = torch.stack(
        [torch.cat([row[:n].flip(0), row[n:]]) for row, n in zip(src, src_lens, strict=True)]
    )
    tgt_in = torch.cat([torch.full((8, 1), 2), tgt], dim=1)  # BOS + reversed ids
    tgt_out = torch.cat([tgt, torch.zeros(8, 1, dtype=torch.long)], dim=1)
    tgt_out[torch.arange(8), src_lens] = 3  # EOS after the last real token
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(100):  # the loss falls below 0.05 after 50-70 steps (seeds 0-2)
        logits, _ = model(src, src_lens, src_mask, tgt_in)
        loss = F.cross_entropy(logits.reshape(-1, V), tgt_out.reshape(-1), ignore_index=0)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.05
