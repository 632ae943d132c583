"""The recipe search's flags: word dropout, patience on validation loss or BLEU, the warm-up's start
against fairseq's, and refusals of bad values (the latest checkpoints kept for averaging and the
validation search's length penalty in a run: tests/e2e/test_recipe_flags.py)."""

import math

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import EarlyStopping

from seq2seq.data.tokenizer import BOS, EOS, PAD, UNK
from seq2seq.errors import UserError
from seq2seq.training.config import TrainConfig, build_parser, parse_args, validate
from seq2seq.training.phases import run_callbacks
from seq2seq.training.system import lr_factor, word_dropout


def batch_of(rows: int = 64, length: int = 30) -> dict[str, torch.Tensor]:
    ids = torch.randint(4, 100, (rows, length))  # (B, L) real subwords
    ids[:, 0], ids[:, -1], ids[:, -3:-1] = BOS, PAD, PAD  # specials at both ends
    ids[:, -4] = EOS
    return {"src": ids.clone(), "tgt_in": ids.clone(), "tgt_out": ids.clone()}


def test_word_dropout_replaces_about_p_of_the_real_subwords_by_unk_and_nothing_else():
    batch = batch_of()
    torch.manual_seed(0)
    out = word_dropout(batch, 0.25)
    real = batch["src"] > EOS  # (B, L)
    for key in ("src", "tgt_in"):
        changed = out[key] != batch[key]
        assert (out[key][changed] == UNK).all()
        assert not changed[~real].any()  # PAD, BOS and EOS stay
        assert 0.2 < changed[real].float().mean().item() < 0.3
    assert torch.equal(out["tgt_out"], batch["tgt_out"])  # the loss reads the true targets
    assert not torch.equal(out["src"] != batch["src"], out["tgt_in"] != batch["tgt_in"])
    torch.manual_seed(0)
    assert torch.equal(word_dropout(batch, 0.25)["src"], out["src"])  # the seed fixes the draws
    assert torch.equal(word_dropout(batch, 0.0)["src"], batch["src"])


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--word-dropout", "1.0", "--word-dropout must be in [0, 1)"),
        ("--keep-last", "-1", "--keep-last must be zero or more"),
        ("--val-length-penalty", "-0.5", "--val-length-penalty must be zero or more"),
        ("--clip-norm", "-1", "--clip-norm must be zero or more"),  # it turned clipping off unsaid
        (
            "--seed",
            "-1",
            "--seed must be 0 to 4294967295",
        ),  # a traceback after the data's preparation
    ],
)
def test_bad_recipe_flags_are_refused_by_name(flag, value, message):
    with pytest.raises(Exception, match=message.replace("[", r"\[").replace(")", r"\)")):
        parse_args([flag, value])


class ScriptedScores(L.LightningModule):
    """A module whose i-th validation logs val/bleu and val/loss from `scores(i)`."""

    def __init__(self, scores) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.scores, self.validations = scores, 0

    def training_step(self, batch, batch_idx):
        return (self.weight * batch).sum()

    def validation_step(self, batch, batch_idx):
        pass

    def on_validation_epoch_end(self):
        bleu, loss = self.scores(self.validations)
        self.log("val/bleu", float(bleu))
        self.log("val/loss", float(loss))
        self.validations += 1

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.ones(2, 1))  # two batches an epoch

    def val_dataloader(self):
        return torch.utils.data.DataLoader(torch.ones(1, 1))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def validations_run(metric: str, scores, tmp_path) -> int:
    """Validations of a 10-epoch run that stops by the EarlyStopping train.py would add."""
    cfg = parse_args(["--patience", "2", "--patience-metric", metric])
    stops = [cb for cb in run_callbacks(cfg, str(tmp_path), None) if isinstance(cb, EarlyStopping)]
    assert len(stops) == 1
    trainer = L.Trainer(max_epochs=10, callbacks=stops, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0, accelerator="cpu")  # fmt: skip
    module = ScriptedScores(scores)
    trainer.fit(module)
    return module.validations


@pytest.mark.parametrize(
    ("scores", "stopped_by"),
    [
        (lambda i: (i, i), "loss"),  # BLEU rises while the loss rises too (gets worse)
        (lambda i: (-i, -i), "bleu"),  # the loss falls while BLEU falls
    ],
)
def test_patience_counts_validations_without_a_better_patience_metric(scores, stopped_by, tmp_path):
    other = {"bleu": "loss", "loss": "bleu"}[stopped_by]
    assert validations_run(stopped_by, scores, tmp_path) == 3  # the first, then two not better
    assert validations_run(other, scores, tmp_path) == 10  # every epoch's validation improved


def test_patience_metric_defaults_to_bleu_and_refuses_others(capsys):
    assert parse_args([]).patience_metric == "bleu"
    assert "--patience-metric {bleu,loss}" in build_parser().format_help()
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--patience-metric", "chrf"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--patience-metric: invalid choice: 'chrf'" in err and err.count("\n") == 1
    with pytest.raises(UserError, match=r"^`patience_metric` .*'chrf'"):
        validate(TrainConfig(patience_metric="chrf"))


def fairseq_inverse_sqrt(updates_done: int, peak: float, warmup: int, init: float) -> float:
    """The rate of the next update under fairseq's inverse_sqrt scheduler, written from its
    definition: from `init` linearly to `peak` over `warmup` updates, then peak * sqrt(warmup / n)."""
    if updates_done < warmup:
        return init + updates_done * (peak - init) / warmup
    return peak * math.sqrt(warmup / updates_done)


def test_warmup_from_lr_over_n_stays_within_one_warmup_step_of_fairseqs_1e_7_start():
    """Why there is no --warmup-init-lr: Wu et al.'s start at 1e-7 differs from ours, which starts
    at lr / N, by less than lr / N at every update of their 8,000."""
    peak, warmup = 5e-3, 2000
    gaps = [
        abs(peak * lr_factor(done, "inverse_sqrt", warmup, 8000, 0.0)
            - fairseq_inverse_sqrt(done, peak, warmup, 1e-7))
        for done in range(8000)
    ]  # fmt: skip
    assert max(gaps) <= peak / warmup
    assert gaps[0] > peak / warmup / 2  # the first update is where they differ most: not equal
    assert "--warmup-init-lr" in build_parser().format_help()  # the help says why it is absent
