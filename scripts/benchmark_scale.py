"""Preparation and training start-up on a large synthetic corpus: `python scripts/benchmark_scale.py --help`, the same as `python -m seq2seq.benchmarks.scale`
(seq2seq.benchmarks.scale)."""

import sys

from seq2seq.benchmarks.scale import main

if __name__ == "__main__":
    sys.exit(main())
