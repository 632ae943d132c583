"""Memory of training and of the heatmaps: `python scripts/benchmark_memory.py --help`, the same as `python -m seq2seq.benchmarks.memory`
(seq2seq.benchmarks.memory)."""

import sys

from seq2seq.benchmarks.memory import main

if __name__ == "__main__":
    sys.exit(main())
