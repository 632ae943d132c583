"""Every row of docs/guides/errors.md, printed whole by scripts/train.py, and the other lines that page quotes.

The page's tables whose first column is `case` are read here, and every row needs an entry below
keyed by its `case` text: `test_every_row_of_the_doc_has_a_case` fails on a row without one (and
on an entry whose row is gone). Each check runs in a fresh folder holding `good`, a 30-pair corpus,
with `tests/conftest.py::tiny_train_args` on `good` and the log folder `runs`, then the row's flags
(the first code span of its `flags` cell); the entry's setup makes whatever else the row's
parenthesis describes. A refusal (a `message` column) must print exactly the row's message as its
one `error:` line, exit with status 2 and leave nothing half-written. To add a row: write it in the
page, then its setup here (`flags_only` when its flags are all it needs).
"""

import contextlib
import errno
import os
import re
import shlex
import shutil
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import seq2seq.data.cachelock as cachelock
import seq2seq.data.datamodule
import seq2seq.data.prepare
import seq2seq.training.launch as launch
from seq2seq.commands import train
from seq2seq.commands import translate as translate_command
from seq2seq.data.datamodule import TranslationDataModule
from seq2seq.data.prepare import prepare
from seq2seq.training.config import parse_args
from seq2seq.training.system import TranslationSystem
from tests.conftest import ROOT, tiny_train_args, write_corpus

DOC = ROOT / "docs" / "guides" / "errors.md"
SMALL = {"train": 30, "val": 5}
RUN = Path("runs/rnn-additive/version_0/checkpoints")  # the log folder's first run
Setup = Callable[[Path, pytest.FixtureRequest], dict[str, str] | None]


def doc_rows(column: str | None = None) -> dict[str, dict[str, str]]:
    """Rows of the tables of docs/guides/errors.md whose first column is `case` (those with `column`, if
    given), keyed by their case text; each row is {column name: cell text}."""
    rows, header = {}, None
    for line in DOC.read_text("utf-8").splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip()[1:-1])]
        if header is None:
            header = cells
        elif not set(line) <= set("|-: ") and header[0] == "case" and column in (None, *header):
            row = dict(zip(header, cells, strict=True))
            assert row["case"] not in rows, (
                f"two rows of docs/guides/errors.md read {row['case']!r}"
            )
            rows[row["case"]] = row
    return rows


def code(cell: str) -> str:
    """The text of a cell that is one code span."""
    assert re.fullmatch(r"`[^`]+`", cell), f"not one code span: {cell}"
    return cell[1:-1]


def flags(row: dict[str, str]) -> list[str]:
    return shlex.split(re.match(r"`([^`]+)`", row["flags"])[1])


def in_doc(pattern: str) -> str:
    """The one code span of docs/guides/errors.md that matches `pattern` (for lines outside the tables)."""
    [found] = [s for s in re.findall(r"`([^`]+)`", DOC.read_text("utf-8")) if re.match(pattern, s)]
    return found


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder as each check starts it (`good`), after a run of the tiny flags (20 updates,
    validating every 10): its data cache and runs/rnn-additive/version_0/checkpoints/ with
    best-10.ckpt, best-20.ckpt and last.ckpt."""
    root = tmp_path_factory.mktemp("trained")
    with contextlib.chdir(root):
        write_corpus(Path("good"), SMALL)
        assert train.main(tiny_train_args(Path("good"), Path("runs"))) == 0
    return root


# Setups, one per row: each fills the check's folder (the working folder) and may return values for
# the placeholders of the row's message.


def flags_only(tmp: Path, request: pytest.FixtureRequest) -> None:
    """The flags alone give the message."""


def short_train_en(tmp: Path, request: pytest.FixtureRequest) -> None:
    write_corpus(Path("short"), SMALL)
    lines = Path("short/train.en").read_text().splitlines()
    Path("short/train.en").write_text("\n".join(lines[:-1]) + "\n")


def latin1_line(tmp: Path, request: pytest.FixtureRequest) -> None:
    write_corpus(Path("latin1"), SMALL)
    lines = Path("latin1/val.de").read_bytes().splitlines(keepends=True)
    lines[2] = "Große straße\n".encode("latin-1")
    Path("latin1/val.de").write_bytes(b"".join(lines))


def no_val_split(tmp: Path, request: pytest.FixtureRequest) -> None:
    write_corpus(Path("noval"), {"train": 30, "test": 5})


def corpus_c(tmp: Path, request: pytest.FixtureRequest) -> None:
    write_corpus(Path("c"), SMALL)


def a_file(tmp: Path, request: pytest.FixtureRequest) -> None:
    Path("notes.txt").write_text("a file\n")


def sysfs(tmp: Path, request: pytest.FixtureRequest) -> dict[str, str]:
    """/sys takes no new files, even from root; what the system says for that is <reason>."""
    if not Path("/sys/kernel").is_dir():
        pytest.skip("no sysfs here")
    try:
        Path("/sys/seq2seq-cache").mkdir()
    except OSError as err:
        return {"<reason>": err.strerror}
    Path("/sys/seq2seq-cache").rmdir()
    pytest.skip("this /sys can be written")


def a_folder(tmp: Path, request: pytest.FixtureRequest) -> None:
    Path("runs").mkdir()


def truncated(tmp: Path, request: pytest.FixtureRequest) -> None:
    torch.save({"state_dict": {"w": torch.zeros(1000)}, "tokenizer": b"x"}, "t.ckpt")
    data = Path("t.ckpt").read_bytes()
    Path("t.ckpt").write_bytes(data[: len(data) // 2])


def text_file(tmp: Path, request: pytest.FixtureRequest) -> None:
    Path("notes.ckpt").write_text("not a checkpoint\n")


def foreign(tmp: Path, request: pytest.FixtureRequest) -> None:
    torch.save({"model": {"w": torch.zeros(3)}}, "other.ckpt")


def trained(tmp: Path, request: pytest.FixtureRequest) -> None:
    """The tiny run of `trained_run`, with its data cache, copied here."""
    root = request.getfixturevalue("trained_run")
    for name in ("runs", "data"):
        shutil.copytree(root / name, tmp / name)


def trained_then_edited(tmp: Path, request: pytest.FixtureRequest) -> dict[str, str]:
    """The tiny run, then a line of its training corpus changed; <then> and <now> are the SHA-1s
    of the training pairs as the checkpoint and as the cache of the edited corpus record them."""
    trained(tmp, request)
    lines = Path("good/train.en").read_text().splitlines()
    lines[3] = lines[3].upper()
    Path("good/train.en").write_text("\n".join(lines) + "\n")
    then = torch.load(RUN / "best-10.ckpt", weights_only=True)[TranslationDataModule.__qualname__]
    now = prepare(parse_args(tiny_train_args(Path("good"), Path("runs")))).meta["train"]["sha1"]
    return {"<then>": then["corpus"][:12], "<now>": now[:12]}


def weights_only(tmp: Path, request: pytest.FixtureRequest) -> None:
    checkpoint = torch.load(request.getfixturevalue("trained_run") / RUN / "last.ckpt")
    for key in ("loops", "optimizer_states", "lr_schedulers"):
        del checkpoint[key]
    torch.save(checkpoint, "weights.ckpt")


def bad_yaml(tmp: Path, request: pytest.FixtureRequest) -> None:
    Path("run.yaml").write_text("seed: 3\nlr: fast\n")


def twice_yaml(tmp: Path, request: pytest.FixtureRequest) -> None:
    Path("run.yaml").write_text("lr: 0.01\nseed: 3\nlr: 0.5\n")


def no_gpu(tmp: Path, request: pytest.FixtureRequest) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")


def empty_train(tmp: Path, request: pytest.FixtureRequest) -> None:
    write_corpus(Path("c"), {"train": 0, "val": 5})


def empty_val(tmp: Path, request: pytest.FixtureRequest) -> None:
    write_corpus(Path("c"), SMALL)
    for lang in ("de", "en"):
        Path(f"c/val.{lang}").write_text("")


def links(lines: int, **line: str) -> Setup:
    """A 200-pair corpus `c` and FILE, a links file of `lines` empty lines (a pair without links),
    but for the lines given (`l5="1:2"`: line 5 holds `1:2`)."""

    def setup(tmp: Path, request: pytest.FixtureRequest) -> None:
        write_corpus(Path("c"), {"train": 200, "val": 5})
        rows = [""] * lines
        for key, value in line.items():
            rows[int(key[1:]) - 1] = value
        Path("FILE").write_text("".join(row + "\n" for row in rows))

    return setup


def six_words_at_line_7(tmp: Path, request: pytest.FixtureRequest) -> None:
    links(200, l7="1-9")(tmp, request)
    for lang, text in (("de", "Der alte mann sieht ein kind"), ("en", "The old man sees a child")):
        lines = Path(f"c/train.{lang}").read_text("utf-8").splitlines()
        lines[6] = text
        Path(f"c/train.{lang}").write_text("\n".join(lines) + "\n", "utf-8")


REFUSALS: dict[str, Setup] = {
    "corpus sides with different line counts": short_train_en,
    "non-UTF-8 bytes": latin1_line,
    "unknown split": no_val_split,
    "unknown language": corpus_c,
    "vocabulary size that sentencepiece cannot reach": corpus_c,
    "log folder below a file": a_file,
    "log folder that cannot be written": sysfs,
    "sentencepiece model that cannot be read": flags_only,
    "cache folder that cannot be written": sysfs,
    "`--resume PATH` that does not exist": flags_only,
    "`--resume PATH` that is a folder": a_folder,
    "`--resume` with no run to resume": flags_only,
    "truncated checkpoint": truncated,
    "a file that is not a checkpoint": text_file,
    "foreign checkpoint": foreign,
    "weights-only checkpoint": weights_only,
    "checkpoint of another model": trained,
    "checkpoint of another tokenizer": trained,
    "resume with other batching or seed": trained,
    "resume with another recipe": trained,
    "resume on edited training pairs": trained_then_edited,
    "a YAML value of the wrong type": bad_yaml,
    "a YAML key given twice": twice_yaml,
    "a learning-rate floor below zero": flags_only,
    "precision typo": flags_only,
    "strategy typo": flags_only,
    "a GPU asked for where there is none": no_gpu,
    "devices typo": flags_only,
    "a combination Lightning refuses": flags_only,
    "`--max-len` past the Transformer's positions": flags_only,
    "a setting the model does not read": flags_only,
    "a setting read only with another, without it": flags_only,
    "validation's length penalty with greedy validation": flags_only,
    "heatmap sentences with heatmaps off": flags_only,
    "a guided-alignment cost with no links": flags_only,
    "no training pair within `--max-len`": corpus_c,
    "an empty training split": empty_train,
    "an empty validation split": empty_val,
    # guided alignment
    "the file ends before the training split": links(199),
    "the file goes on after it": links(201),
    "a link that is not `i-j`": links(200, l5="1:2"),
    "a word index outside its sentence": six_words_at_line_7,
    "no such file": flags_only,
    "a negative weight": flags_only,
    "a Transformer layer it does not have": flags_only,
    "a Transformer head it does not have": flags_only,
}


def long_pairs(tmp: Path, request: pytest.FixtureRequest) -> None:
    for lang in ("de", "en"):
        with Path(f"good/train.{lang}").open("a") as file:
            file.write("\n" + " ".join(["hund"] * 80) + "\n")  # one empty pair, one too long


def a_long_val_pair(tmp: Path, request: pytest.FixtureRequest) -> None:
    for lang in ("de", "en"):
        with Path(f"good/val.{lang}").open("a") as file:
            file.write(" ".join(["hund"] * 1100) + "\n")  # over 1,023 subwords: no position left


LOG_LINES: dict[str, Setup] = {
    "empty lines, sentences over `--max-len` subwords": long_pairs,
    "validation or test pairs over the Transformer's 1,024 positions": a_long_val_pair,
}


def as_on_an_avx2_cpu(tmp: Path, request: pytest.FixtureRequest) -> None:
    monkeypatch = request.getfixturevalue("monkeypatch")
    monkeypatch.setattr(launch, "native_bf16", lambda: False)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")


WARNINGS: dict[str, Setup] = {
    "bf16 on a CPU without native bf16 (AVX2 only: "
    "`torch.ops.mkldnn._is_mkldnn_bf16_supported()` is False)": as_on_an_avx2_cpu,
}


def signal_during_update(signum: int) -> Setup:
    """The signal `signum`, sent to this process while update 6 trains."""

    def setup(tmp: Path, request: pytest.FixtureRequest) -> None:
        monkeypatch = request.getfixturevalue("monkeypatch")

        def hook(self: TranslationSystem, batch: dict, batch_idx: int) -> None:
            if self.trainer.global_step == 5:
                os.kill(os.getpid(), signum)

        monkeypatch.setattr(TranslationSystem, "on_train_batch_start", hook, raising=False)

    return setup


def signal_while_reading(tmp: Path, request: pytest.FixtureRequest) -> None:
    monkeypatch = request.getfixturevalue("monkeypatch")
    setup = TranslationDataModule.setup

    def reading(self: TranslationDataModule, stage: str | None = None) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        setup(self, stage)

    monkeypatch.setattr(TranslationDataModule, "setup", reading)


def full_disk(target: object, name: str, cache_first: bool = False) -> Setup:
    """`target.name` raises ENOSPC, as a full disk does (a real one: tests/e2e/test_storage.py); with
    `cache_first`, after the data cache is built."""

    def setup(tmp: Path, request: pytest.FixtureRequest) -> None:
        if cache_first:
            prepare(parse_args(tiny_train_args(Path("good"), Path("runs"))))

        def full(*args: object, **kwargs: object) -> None:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        request.getfixturevalue("monkeypatch").setattr(target, name, full)

    return setup


def cached(change: Callable[[Path], dict[str, str]]) -> Setup:
    """The data cache of the tiny flags, built here, then damaged by `change(cache folder)`."""

    def setup(tmp: Path, request: pytest.FixtureRequest) -> dict[str, str]:
        prepare(parse_args(tiny_train_args(Path("good"), Path("runs"))))
        return change(Path("data/cache"))

    return setup


def cut_shard(cache: Path) -> dict[str, str]:
    [folder] = (cache / "encoded").glob("*-train-*")
    shard = folder / "shard-00000.arrow"
    size = shard.stat().st_size
    os.truncate(shard, size // 2)
    return {"<folder>": str(folder), "<cut>": f"{size // 2:,}", "<size>": f"{size:,}"}


def overwrite_shard(cache: Path) -> dict[str, str]:
    [folder] = (cache / "encoded").glob("*-train-*")
    shard = folder / "shard-00000.arrow"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 64] = b"\xff" * 64  # the same size, other bytes
    shard.write_bytes(bytes(data))
    return {"<folder>": str(folder)}


def empty_meta(cache: Path) -> dict[str, str]:
    [folder] = (cache / "encoded").glob("*-val-*")
    (folder / "meta.json").write_text("")
    return {"<folder>": str(folder)}


def cut_tokenizer(cache: Path) -> dict[str, str]:
    [model] = cache.glob("spm-*.model")
    data = model.read_bytes()
    model.write_bytes(data[: len(data) * 2 // 3])
    return {"<model>": str(model), "<bytes>": f"{len(data) * 2 // 3:,}", "<name>": model.name}


def no_locks(tmp: Path, request: pytest.FixtureRequest) -> None:
    def lockf(fd: int, operation: int) -> None:
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))

    request.getfixturevalue("monkeypatch").setattr(cachelock.fcntl, "lockf", lockf)


def foreign_lock(tmp: Path, request: pytest.FixtureRequest) -> dict[str, str]:
    """Opening the lock file is refused, as for another user's 0644 file (root is never refused);
    <lock> is filled in with its name when it is tried."""
    found: dict[str, str] = {}

    def refused(lock: Path) -> int:
        lock.touch()
        found["<lock>"] = lock.name
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))

    request.getfixturevalue("monkeypatch").setattr(cachelock, "_open_shared", refused)
    return found


FAULTS: dict[str, Setup] = {
    "SIGTERM during training": signal_during_update(signal.SIGTERM),
    "the stop signal": signal_during_update(signal.SIGUSR1),
    "the time budget spent in training": cached(lambda cache: {}),  # the data ready at once
    "the time budget spent in preparation": flags_only,  # a cold cache
    "a stop before training begins": signal_while_reading,
    "a full disk at a checkpoint": full_disk(os, "fsync", cache_first=True),
    "a full disk at the tokenizer": full_disk(os, "fsync"),
    "a full disk at a split": full_disk(seq2seq.data.prepare, "fsynced"),
    "a shard cut short": cached(cut_shard),
    "an empty `meta.json`": cached(empty_meta),
    "a damaged tokenizer": cached(cut_tokenizer),
    "a shard overwritten in place": cached(overwrite_shard),
    "a file system without locks": no_locks,
    "another user's lock file": foreign_lock,
}


def test_every_row_of_the_doc_has_a_case() -> None:
    rows, cases = doc_rows().keys(), [*REFUSALS, *LOG_LINES, *WARNINGS, *FAULTS]
    assert sorted(rows - set(cases)) == [], "rows of docs/guides/errors.md with no case here"
    assert sorted(set(cases) - rows) == [], (
        "cases here whose row is gone from docs/guides/errors.md"
    )


def snapshot(folder: Path) -> list[tuple[str, int]]:
    return sorted((str(p), p.stat().st_size) for p in folder.rglob("*")) if folder.exists() else []


@pytest.mark.parametrize("case", doc_rows("message"))
def test_each_refusal_is_printed_whole_exits_2_and_writes_nothing(
    case: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
    capsys: pytest.CaptureFixture[str],
) -> None:
    row = doc_rows("message")[case]
    assert case in REFUSALS, f"no case in tests/e2e/test_errors.py for the row {case!r}"
    monkeypatch.chdir(tmp_path)  # paths in the doc are relative to it; the cache is ./data/cache
    write_corpus(Path("good"), SMALL)
    expected = code(row["message"])
    for placeholder, value in (REFUSALS[case](tmp_path, request) or {}).items():
        expected = expected.replace(placeholder, value)
    runs = snapshot(Path("runs"))
    assert train.main(tiny_train_args(Path("good"), Path("runs"), *flags(row))) == 2
    err = capsys.readouterr().err.strip()
    # Only datasets' progress bars (tokenizing the splits read before the bad one) may precede it.
    assert "Traceback" not in err and err.count("error: ") == 1, err
    assert err.splitlines()[-1] == expected
    assert snapshot(Path("runs")) == runs  # no run folder, nothing written into a resumed one
    cache = Path("data/cache")
    leftovers = [p for p in cache.rglob(".*")] if cache.exists() else []
    assert not leftovers  # caches are built in temporary names and renamed only when complete


@pytest.mark.parametrize("case", doc_rows("printed"))
def test_each_stop_and_storage_fault_prints_its_line_and_exit_status(
    case: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
    capsys: pytest.CaptureFixture[str],
) -> None:
    row = doc_rows("printed")[case]
    monkeypatch.chdir(tmp_path)
    write_corpus(Path("good"), SMALL)
    values = FAULTS[case](tmp_path, request)  # may fill in while the run goes on
    status = train.main(tiny_train_args(Path("good"), Path("runs"), *flags(row)))
    said = capsys.readouterr().err.splitlines()
    expected = code(row["printed"]).replace("<cwd>", str(tmp_path.resolve()))
    if "<N>" in expected:
        expected = expected.replace("<N>", str(torch.load(RUN / "last.ckpt")["global_step"]))
    for placeholder, value in (values or {}).items():
        expected = expected.replace(placeholder, value)
    assert status == int(row["status"]), said[-5:]
    assert expected in said, said[-5:]
    assert "Traceback" not in "\n".join(said)


@pytest.mark.parametrize("case", doc_rows("log line"))
def test_each_dropped_pairs_line_is_logged_whole(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    """Empty and over-long pairs are not errors: they are dropped, and the corpus's line counts them."""
    row = doc_rows("log line")[case]
    monkeypatch.chdir(tmp_path)
    write_corpus(Path("good"), SMALL)
    LOG_LINES[case](tmp_path, request)
    said: list[str] = []
    monkeypatch.setattr(seq2seq.data.datamodule, "rank_zero_info", said.append)
    cfg = parse_args(tiny_train_args(Path("good"), Path("runs"), *flags(row)))
    dm = TranslationDataModule(cfg, positions=cfg.positions)
    dm.prepare_data()
    dm.setup("fit")
    assert [line for line in said if "dropped:" in line] == [code(row["log line"])]
    val_rows = sorted(i for batch in dm.val_dataloader() for i in batch["index"].tolist())
    assert val_rows == list(range(SMALL["val"]))  # a long validation pair, the last, is in no batch


@pytest.mark.parametrize("case", doc_rows("line"))
def test_each_warning_is_one_line_and_the_run_goes_on(
    case: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    row = doc_rows("line")[case]
    monkeypatch.chdir(tmp_path)
    write_corpus(Path("good"), SMALL)
    WARNINGS[case](tmp_path, request)
    args = tiny_train_args(Path("good"), Path("runs"), *flags(row), "--max-steps", "2")
    assert train.main(args) == 0
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: ")]
    assert said == [code(row["line"])]
    # Nor does Lightning advertise its cloud services between our lines (its "Tip: ..." lines).
    assert not [r for r in caplog.records if "Tip:" in r.getMessage()]


def test_non_finite_loss_stops_with_the_step_and_keeps_the_last_good_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.chdir(tmp_path)
    write_corpus(Path("good"), SMALL)
    training_step = TranslationSystem.training_step

    def poisoned(self: TranslationSystem, batch: dict, batch_idx: int) -> torch.Tensor:
        loss = training_step(self, batch, batch_idx)
        return loss * float("nan") if self.trainer.global_step >= 15 else loss  # update 16

    monkeypatch.setattr(TranslationSystem, "training_step", poisoned)
    args = tiny_train_args(Path("good"), Path("runs"), "--max-steps", "40", "--max-epochs", "100")
    assert train.main(args) == 3
    err = capsys.readouterr().err.strip().splitlines()[-1]
    expected = in_doc(r"error: training diverged").replace("<cwd>", str(tmp_path.resolve()))
    assert err == expected
    last = torch.load(RUN / "last.ckpt", weights_only=True)
    assert last["global_step"] == 10
    assert all(t.isfinite().all() for t in last["state_dict"].values())
    assert sorted(p.name for p in RUN.iterdir()) == ["best-10.ckpt", "last.ckpt"]


def test_translate_refuses_a_gz_input_that_is_not_gzip(
    trained_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("sources.gz").write_text("Ein hund läuft\n")  # plain text under a .gz name
    ckpt = str(trained_run / RUN / "last.ckpt")
    assert translate_command.main([ckpt, "--input", "sources.gz"]) == 2
    assert capsys.readouterr().err.strip() == in_doc(r"error: --input sources.gz")
