"""scripts/plot_benchmarks.py refuses a JSON file of another script in one line (its figures:
tests/e2e/test_plot_benchmarks.py and tests/e2e/test_benchmark.py)."""

import json
from pathlib import Path

from seq2seq.benchmarks import plots as plot_benchmarks


def test_a_file_of_another_script_is_refused_in_one_line(tmp_path: Path, capsys) -> None:
    other = tmp_path / "scale.json"
    other.write_text(json.dumps({"pairs": 10, "prepare": {}, "train": {}}))
    assert plot_benchmarks.main(["--memory", str(other), "--out-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: {other}: not the JSON of benchmark_memory.py (no train, updates)"
    assert plot_benchmarks.main(["--out-dir", str(tmp_path)]) == 2
    assert not list(tmp_path.glob("*.png"))
