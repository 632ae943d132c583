"""Plots of the benchmarks' JSON: `python scripts/plot_benchmarks.py --help`, the same as `python -m seq2seq.benchmarks.plots`
(seq2seq.benchmarks.plots)."""

import sys

from seq2seq.benchmarks.plots import main

if __name__ == "__main__":
    sys.exit(main())
