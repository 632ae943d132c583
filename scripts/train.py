"""Train a translator: `python scripts/train.py --score additive`, the same as `seq2seq train`
(seq2seq.commands.train; --help for every flag)."""

import sys

from seq2seq.commands.train import main

if __name__ == "__main__":
    sys.exit(main())
