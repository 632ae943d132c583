"""Both benchmark scripts run end to end and report every figure (their structure, never their
timings)."""

import json

import pytest
import torch

from seq2seq.benchmarks import memory as benchmark_memory
from seq2seq.benchmarks import plots as plot_benchmarks
from seq2seq.benchmarks import speed as benchmark

TINY = ["--vocab-size", "100", "--emb-size", "16", "--hidden-size", "32", "--batch-tokens", "400"]


def test_quick_benchmark_writes_every_figure(tiny_corpus, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)  # the data cache goes to ./data/cache
    out = tmp_path / "bench.json"
    eager = [k for k in benchmark.PATHS if not benchmark.PATHS[k].compiles]  # compiled: below
    argv = ["--quick", "--data-dir", str(tiny_corpus), *TINY, "--train-updates", "12",
            "--json", str(out), "--force-bf16", "--paths", *eager]  # bf16 on any CPU  # fmt: skip
    assert benchmark.main(argv) == 0
    result = json.loads(out.read_text())
    assert list(result["paths"]) == eager == ["fast", "bf16", "plain", "reference"]
    for name, figures in result["paths"].items():
        for key in ("tokens_per_sec", "sec_per_update", "matmul_pct", "warmup_sec"):
            assert figures[key] > 0, (name, key)
        assert figures["peak_gpu_mb"] is None  # CPU: no GPU column
    assert result["paths"]["reference"]["vs_reference"] == 1.0
    assert result["paths"]["plain"]["vs_plain"] == 1.0  # the model with no kernel plugged in
    assert result["mflop_per_token"] > 0 and result["matmul"]["fp32"] > 0
    assert len(result["rounds"]) == 3 and result["device"] == "cpu"
    decode = result["decode"]
    assert decode["sentences"] == 20 and decode["trained_updates"] == 12
    assert decode["greedy_sent_per_sec"] > 0 and decode["beam5_sent_per_sec"] > 0
    printed = capsys.readouterr()
    table = printed.out
    assert (
        "vs reference" in table
        and "vs plain" in table
        and "beam-5" in table
        and "peak GPU" not in table
    )
    # Decoding is timed before any path's windows, as in a process that only translates.
    assert printed.err.index("decoding 20 validation") < printed.err.index("round 1/3")
    # header, cpu, column heads, 4 paths, 2 lines; the whole run's line and a row per trained path
    assert table.count("\n") == 1 + 1 + 1 + 4 + 2 + 1 + 3
    # The whole run: each phase timed once in this process, counted as often as the run does it.
    whole = result["whole_run"]
    assert list(whole["paths"]) == ["fast", "bf16", "plain"]  # the reference trains no run
    shape = whole["shape"]
    assert shape["updates"] == shape["updates_per_epoch"] * 30 and shape["validations"] == 30
    assert shape["val_sentences"] == 20 and shape["test_sentences"] == 20
    assert whole["phases"]["prepare_cold"] and whole["phases"]["checkpoint_sec"] > 0
    for name, run in whole["paths"].items():
        per_update = result["paths"][name]["sec_per_update"]
        assert run["updates_sec"] == pytest.approx(shape["updates"] * per_update)
        parts = [v for k, v in run.items() if k != "total_sec"]
        assert run["total_sec"] == pytest.approx(sum(parts)) and min(parts) > 0
        assert f"  {name}: " in table
    assert "whole run (estimated from the parts measured above): " in table
    cpu = result["cpu"]
    assert f"cpu: {cpu['model']}, capability {torch.backends.cpu.get_cpu_capability()}" in table
    # Progress on stderr while it runs: one line per round, with every path's speed.
    rounds = [line for line in printed.err.splitlines() if line.startswith("round ")]
    assert [line.split(":")[0] for line in rounds] == ["round 1/3", "round 2/3", "round 3/3"]
    assert all(f"{name} " in rounds[0] for name in result["paths"])
    # A CPU without native bf16 gets a row saying why its bf16 path did not run.
    del result["paths"]["bf16"]
    result["skipped"] = {"bf16": "skipped: no native bf16 on this CPU (AVX2)"}
    assert "\nbf16       skipped: no native bf16" in benchmark.render(result)
    # A CUDA run's table (not runnable here) gains a peak-memory column and the bf16 matmul rate.
    result["device"], result["matmul"]["bf16"] = "NVIDIA H200", 700_000.0
    for figures in result["paths"].values():
        figures["peak_gpu_mb"] = 630.0
    gpu = benchmark.render(result)
    assert "peak GPU MB" in gpu and "bf16 700,000" in gpu and "NVIDIA H200" in gpu
    # plot_benchmarks draws the JSON as written: a bar per path, tallest where tokens/s are highest.
    assert plot_benchmarks.main(["--speed", str(out), "--out-dir", str(tmp_path)]) == 0
    assert (tmp_path / "speed.png").stat().st_size > 0
    written = json.loads(out.read_text())
    bars = plot_benchmarks.speed_figure(written).axes[0].patches
    speeds = [f["tokens_per_sec"] for f in written["paths"].values()]
    assert [bar.get_height() for bar in bars] == pytest.approx(speeds)
    # A skipped path is a labelled gap after the bars that ran.
    written["skipped"] = {"bf16": "skipped: no native bf16"}
    del written["paths"]["bf16"]
    ax = plot_benchmarks.speed_figure(written).axes[0]
    assert len(ax.patches) == len(written["paths"]) == 3
    assert [t.get_text() for t in ax.get_xticklabels()][-1] == "bf16"


def test_quick_memory_benchmark_reports_probes_runs_and_heatmaps(
    tiny_corpus, tmp_path, monkeypatch, capsys
) -> None:
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "memory.json"
    argv = ["--quick", "--updates", "4", "--data-dir", str(tiny_corpus), *TINY, "--json", str(out)]
    assert benchmark_memory.main([*argv, "--force-bf16"]) == 0  # both precisions on any CPU
    result = json.loads(out.read_text())
    assert list(result["probe"]) == [k for k in benchmark.PATHS if not benchmark.PATHS[k].compiles]
    for probe in result["probe"].values():
        assert probe["peak_rss_mb"] >= probe["rss_before_mb"] > 0
    assert list(result["train"]) == ["32-true", "bf16-mixed"]
    for run in result["train"].values():
        assert run["code"] == 0 and run["updates"] == 4
        assert [r["update"] for r in run["rss"]] == [0, 1, 2, 3, 4]  # --every: updates / 4
        assert run["peak_rss_mb"] >= max(r["mb"] for r in run["rss"]) > 0
        kinds = [kind for kind, _ in run["draws"]]
        # Teacher-forced at the start and every update (updates / 4); greedy at both validations.
        assert kinds.count("teacher-forced") == 5 and kinds.count("greedy") == 2
        assert len(run["val_sec"]) == 2
        heatmaps = run["heatmaps"]
        assert 0 < heatmaps["share_of_run"] < 1 and 0 < heatmaps["share_at_defaults"] < 1
        assert heatmaps["greedy_sec"] > 0 and heatmaps["teacher_forced_sec"] > 0
    table = capsys.readouterr().out
    assert "bf16-mixed" in table and "RSS at update 4" in table and "share at defaults" in table
    assert table.startswith(f"cpu: {benchmark.describe_cpu(result['cpu'])}\n")
    # plot_benchmarks: per run, its RSS readings over updates and its peak as a flat line.
    assert plot_benchmarks.main(["--memory", str(out), "--out-dir", str(tmp_path)]) == 0
    assert (tmp_path / "memory.png").stat().st_size > 0
    lines = plot_benchmarks.memory_figure(result).axes[0].get_lines()
    assert len(lines) == 2 * len(result["train"])
    pairs = zip(result["train"].values(), lines[::2], lines[1::2], strict=True)
    for run, rss, peak in pairs:
        assert list(rss.get_xdata()) == [0, 1, 2, 3, 4]
        assert list(rss.get_ydata()) == [r["mb"] for r in run["rss"]]
        assert set(peak.get_ydata()) == {run["peak_rss_mb"]}
