"""Prepare a corpus for training once, beforehand: `python scripts/prepare.py [train.py flags]`, the
same as `seq2seq prepare` (seq2seq.commands.prepare)."""

import sys

from seq2seq.commands.prepare import main

if __name__ == "__main__":
    sys.exit(main())
