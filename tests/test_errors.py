"""Every row of docs/errors.md from scripts/train.py: one line on stderr, exit 2 (3 for divergence),
nothing half-written in the log or data folders."""

import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from seq2seq.config import TrainConfig
from seq2seq.system import TranslationSystem
from tests.conftest import load_script, tiny_train_args, write_corpus

train = load_script("train")
SMALL = {"train": 30, "val": 5}


def short_train_en(tmp: Path) -> list[str]:
    corpus = write_corpus(tmp / "short", SMALL)
    lines = (corpus / "train.en").read_text().splitlines()
    (corpus / "train.en").write_text("\n".join(lines[:-1]) + "\n")
    return ["--data-dir", str(corpus)]


def latin1_line(tmp: Path) -> list[str]:
    corpus = write_corpus(tmp / "latin1", SMALL)
    lines = (corpus / "val.de").read_bytes().splitlines(keepends=True)
    lines[2] = "Große straße\n".encode("latin-1")
    (corpus / "val.de").write_bytes(b"".join(lines))
    return ["--data-dir", str(corpus)]


def no_val_split(tmp: Path) -> list[str]:
    corpus = write_corpus(tmp / "noval", {"train": 30, "test": 5})
    return ["--data-dir", str(corpus)]


def unknown_language(tmp: Path) -> list[str]:
    return ["--data-dir", str(write_corpus(tmp / "c", SMALL)), "--src", "fr"]


def vocab_too_large(tmp: Path) -> list[str]:
    return ["--data-dir", str(write_corpus(tmp / "c", SMALL)), "--vocab-size", "5000"]


def log_dir_under_a_file(tmp: Path) -> list[str]:
    (tmp / "notes.txt").write_text("a file\n")
    return ["--log-dir", str(tmp / "notes.txt" / "runs")]


def read_only_log_dir(tmp: Path) -> list[str]:
    if os.geteuid() == 0:  # root writes through permission bits, but sysfs takes no new files
        return ["--log-dir", "/sys/seq2seq-runs"]
    (tmp / "ro").mkdir()
    (tmp / "ro").chmod(0o555)
    return ["--log-dir", str(tmp / "ro" / "runs")]


def spm_model_missing(tmp: Path) -> list[str]:
    return ["--spm-model", str(tmp / "missing.model")]


def cache_dir_unwritable(tmp: Path) -> list[str]:
    if os.geteuid() == 0:  # as read_only_log_dir
        return ["--cache-dir", "/sys/seq2seq-cache"]
    (tmp / "ro").mkdir()
    (tmp / "ro").chmod(0o555)
    return ["--cache-dir", str(tmp / "ro" / "seq2seq-cache")]


def resume_missing_path(tmp: Path) -> list[str]:
    return ["--resume", str(tmp / "nope.ckpt")]


def resume_nothing(tmp: Path) -> list[str]:
    return ["--resume"]


def resume_truncated(tmp: Path) -> list[str]:
    torch.save({"state_dict": {"w": torch.zeros(1000)}, "tokenizer": b"x"}, tmp / "t.ckpt")
    data = (tmp / "t.ckpt").read_bytes()
    (tmp / "t.ckpt").write_bytes(data[: len(data) // 2])
    return ["--resume", str(tmp / "t.ckpt")]


def resume_foreign(tmp: Path) -> list[str]:
    torch.save({"model": {"w": torch.zeros(3)}}, tmp / "other.ckpt")
    return ["--resume", str(tmp / "other.ckpt")]


def resume_not_torch(tmp: Path) -> list[str]:
    (tmp / "notes.ckpt").write_text("not a checkpoint\n")
    return ["--resume", str(tmp / "notes.ckpt")]


def yaml_bad_value(tmp: Path) -> list[str]:
    (tmp / "run.yaml").write_text("seed: 3\nlr: fast\n")
    return ["--config", str(tmp / "run.yaml")]


def precision_typo(tmp: Path) -> list[str]:
    return ["--precision", "fp16"]


def strategy_typo(tmp: Path) -> list[str]:
    return ["--strategy", "dpp"]


def gpu_without_one(tmp: Path) -> list[str]:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    return ["--accelerator", "gpu"]


def devices_typo(tmp: Path) -> list[str]:
    return ["--devices", "two"]


def lightning_refusal(tmp: Path) -> list[str]:
    return ["--strategy", "fsdp"]  # a GPU-only strategy: Lightning's own check, as one line


def transformer_max_len(tmp: Path) -> list[str]:
    return ["--model", "transformer", "--max-len", "5000"]


def every_pair_too_long(tmp: Path) -> list[str]:
    return ["--data-dir", str(write_corpus(tmp / "c", SMALL)), "--max-len", "2"]


def empty_training_split(tmp: Path) -> list[str]:
    return ["--data-dir", str(write_corpus(tmp / "c", {"train": 0, "val": 5}))]


def empty_validation_split(tmp: Path) -> list[str]:
    corpus = write_corpus(tmp / "c", SMALL)
    for lang in ("de", "en"):
        (corpus / f"val.{lang}").write_text("")
    return ["--data-dir", str(corpus)]


# (case, its flags, what the one-line message must contain); docs/errors.md shows the full lines.
CASES: list[tuple[Callable[[Path], list[str]], tuple[str, ...]]] = [
    (short_train_en, ("train.de has 30 lines but", "train.en has 29")),
    (latin1_line, ("val.de line 3: not valid UTF-8 (byte 0xdf)",)),
    (no_val_split, ("has no split 'val' (it has: test, train)",)),
    (unknown_language, ("has no language 'fr' (it has: de, en)",)),
    (vocab_too_large, ("--vocab-size 5000 is too large for this corpus (at most",)),
    (log_dir_under_a_file, ("notes.txt is a file, not a folder",)),
    (read_only_log_dir, ("cannot write in", "(Permission denied)")),
    (
        spm_model_missing,
        ("--spm-model", "missing.model: cannot read it (No such file or directory)"),
    ),
    (cache_dir_unwritable, ("--cache-dir", "seq2seq-cache: cannot write there")),
    (resume_missing_path, ("nope.ckpt: no such checkpoint",)),
    (resume_nothing, ("--resume: nothing to resume in", "rnn-additive")),
    (resume_truncated, ("t.ckpt: not a readable checkpoint (truncated",)),
    (resume_foreign, ("other.ckpt: not a seq2seq checkpoint",)),
    (resume_not_torch, ("notes.ckpt: not a readable checkpoint",)),
    (yaml_bad_value, ("run.yaml line 2: lr must be a number, got 'fast'",)),
    (precision_typo, ("--precision fp16: not a Lightning precision (one of 16-true, 16-mixed",)),
    (strategy_typo, ("--strategy dpp: not a Lightning strategy (did you mean ddp?)",)),
    (gpu_without_one, ("--accelerator gpu: no CUDA GPU here; use --accelerator cpu (or auto)",)),
    (devices_typo, ("--devices two: not a count, a list of indices (0,1), -1 (all) or auto",)),
    (lightning_refusal, ("--strategy fsdp", "The strategy 'fsdp' requires a GPU accelerator")),
    (transformer_max_len, ("--max-len 5000: the Transformer has 1,024 positions",)),
    (
        every_pair_too_long,
        ("the training split 'train' yields no batch: all 30 pairs are longer than --max-len 2",),
    ),
    (empty_training_split, ("c: the training split 'train' has no pairs",)),
    (empty_validation_split, ("the validation split 'val' yields no batch: it has no pairs",)),
]


@pytest.mark.parametrize("case, expected", CASES, ids=[case.__name__ for case, _ in CASES])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(
    case: Callable[[Path], list[str]],
    expected: tuple[str, ...],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if (
        case in (read_only_log_dir, cache_dir_unwritable)
        and os.geteuid() == 0
        and not Path("/sys/kernel").is_dir()
    ):
        pytest.skip("root writes through permission bits, and there is no sysfs")
    monkeypatch.chdir(tmp_path)  # the data cache goes to ./data/cache
    corpus = write_corpus(tmp_path / "good", SMALL)
    args = tiny_train_args(corpus, tmp_path / "runs", *case(tmp_path))
    assert train.main(args) == 2
    err = capsys.readouterr().err.strip()
    # Only datasets' progress bars (tokenizing the splits read before the bad one) may precede it.
    assert "Traceback" not in err and err.count("error: ") == 1, err
    line = err.splitlines()[-1]
    assert line.startswith("error: ")
    for text in expected:
        assert text in line
    assert not (tmp_path / "runs").exists()
    cache = tmp_path / "data" / "cache"
    leftovers = [p for p in cache.rglob(".*")] if cache.exists() else []
    assert not leftovers  # caches are built in temporary names and renamed only when complete


def test_dropped_pairs_are_counted_in_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Empty and over-long pairs are not errors: they are dropped and the log line counts them."""
    import seq2seq.data
    from seq2seq.data import TranslationDataModule

    corpus = write_corpus(tmp_path / "c", SMALL)
    for lang in ("de", "en"):
        with (corpus / f"train.{lang}").open("a") as file:
            file.write("\n" + " ".join(["hund"] * 80) + "\n")  # one empty pair, one too long
    said: list[str] = []
    monkeypatch.setattr(seq2seq.data, "rank_zero_info", said.append)
    cfg = TrainConfig(
        data_dir=str(corpus), vocab_size=60, max_len=50, cache_dir=str(tmp_path / "c")
    )
    dm = TranslationDataModule(cfg)
    dm.prepare_data()
    dm.setup("fit")
    assert (
        "dropped: train/empty 1, train/too_long 1 (too_long: longer than max_len, 50 subwords)"
        in said[0]
    )


def test_non_finite_loss_stops_with_the_step_and_keeps_the_last_good_checkpoint(
    tiny_corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.chdir(tmp_path)
    training_step = TranslationSystem.training_step

    def poisoned(self: TranslationSystem, batch: dict, batch_idx: int) -> torch.Tensor:
        loss = training_step(self, batch, batch_idx)
        return loss * float("nan") if self.trainer.global_step >= 15 else loss  # update 16

    monkeypatch.setattr(TranslationSystem, "training_step", poisoned)
    args = tiny_train_args(tiny_corpus, tmp_path / "runs", "--max-steps", "40")
    assert train.main(args) == 3
    err = capsys.readouterr().err.strip().splitlines()[-1]
    ckpts = tmp_path / "runs" / "rnn-additive" / "version_0" / "checkpoints"
    assert err == (
        "error: training diverged: the loss or its gradients are not finite at step 16 "
        f"(try a lower --lr); last good checkpoint: {(ckpts / 'last.ckpt').resolve()}"
    )
    last = torch.load(ckpts / "last.ckpt", weights_only=True)
    assert last["global_step"] == 10
    assert all(t.isfinite().all() for t in last["state_dict"].values())
    assert sorted(p.name for p in ckpts.iterdir()) == ["best-10.ckpt", "last.ckpt"]


def test_bf16_on_a_cpu_without_native_bf16_is_warned_once_in_one_line(
    tiny_corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    import seq2seq.launch as launch

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(launch, "native_bf16", lambda: False)  # as on an AVX2-only CPU
    args = tiny_train_args(tiny_corpus, tmp_path / "runs", "--precision", "bf16-mixed")
    assert train.main([*args, "--max-steps", "2"]) == 0  # a warning: the run goes on
    said = [line for line in capsys.readouterr().err.splitlines() if "bf16" in line]
    capability = torch.backends.cpu.get_cpu_capability()
    assert said == [launch.SLOW_BF16.format(precision="bf16-mixed", capability=capability)]
    assert said[0].startswith("warning: --precision bf16-mixed: this CPU has no native bf16")


def test_translate_refuses_a_gz_input_that_is_not_gzip(
    tiny_checkpoint: Path, tmp_path: Path, capsys
) -> None:
    path = tmp_path / "sources.gz"
    path.write_text("Ein hund läuft\n")  # plain text under a .gz name
    assert load_script("translate").main([str(tiny_checkpoint), "--input", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: --input {path}: not a gzip file (rename it without .gz if it is text)"


def test_validation_pairs_over_the_transformers_positions_are_left_out_and_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import seq2seq.data
    from seq2seq.data import TranslationDataModule

    corpus = write_corpus(tmp_path / "c", SMALL)
    for lang in ("de", "en"):
        with (corpus / f"val.{lang}").open("a") as file:
            file.write(" ".join(["hund"] * 1100) + "\n")  # over 1,023 subwords: no position left
    said: list[str] = []
    monkeypatch.setattr(seq2seq.data, "rank_zero_info", said.append)
    cfg = TrainConfig(
        model="transformer", data_dir=str(corpus), vocab_size=60, cache_dir=str(tmp_path / "c")
    )
    dm = TranslationDataModule(cfg)
    dm.prepare_data()
    dm.setup("fit")
    assert (
        "dropped: val/too_long 1 (too_long: longer than max_len, 100 subwords; in val and "
        in said[0]
    )
    rows = sorted(i for batch in dm.val_dataloader() for i in batch["index"].tolist())
    assert rows == list(range(SMALL["val"]))  # the long pair, the last one, is not in any batch
