"""scripts/plot_benchmarks.py on JSON that benchmark_scale.py writes here (the speed and memory
figures are checked in tests/e2e/test_benchmark.py, on the JSON of the quick runs there)."""

import json
from pathlib import Path

from seq2seq.benchmarks import plots as plot_benchmarks
from seq2seq.benchmarks import scale as benchmark_scale


def test_scale_figure_puts_preparation_memory_against_corpus_size(tmp_path: Path) -> None:
    files = []
    for pairs in (400, 200):  # out of order: the figure sorts them
        out = tmp_path / f"scale-{pairs}.json"
        argv = ["--pairs", str(pairs), "--no-train", "--work", str(tmp_path / "work"),
                "--vocab-size", "100", "--json", str(out)]  # fmt: skip
        assert benchmark_scale.main(argv) == 0
        files.append(out)
    results = [json.loads(f.read_text()) for f in files]
    assert all(r["prepare"]["max_rss_mb"] > 0 and r["train"] == {} for r in results)
    argv = ["--scale", *map(str, files), "--out-dir", str(tmp_path / "figures")]
    assert plot_benchmarks.main(argv) == 0
    assert (tmp_path / "figures" / "scale.png").stat().st_size > 0
    rss, pss = plot_benchmarks.scale_figure(results).axes[0].get_lines()  # no training runs
    assert list(rss.get_xdata()) == [200, 400]
    by_size = {r["pairs"]: r["prepare"] for r in results}
    assert list(rss.get_ydata()) == [by_size[n]["max_rss_mb"] for n in (200, 400)]
    assert list(pss.get_ydata()) == [by_size[n]["tree_pss_mb"] for n in (200, 400)]
