"""Training and decoding speed of the paths side by side: `python scripts/benchmark.py --help`, the same as `python -m seq2seq.benchmarks.speed`
(seq2seq.benchmarks.speed)."""

import sys

from seq2seq.benchmarks.speed import main

if __name__ == "__main__":
    sys.exit(main())
