"""Where one training update's time goes, matmuls split by dtype: `python docs/tools/profile_update.py
--help`, the same as `python -m seq2seq.benchmarks.profile` (seq2seq.benchmarks.profile)."""

import sys

from seq2seq.benchmarks.profile import main

if __name__ == "__main__":
    sys.exit(main())
