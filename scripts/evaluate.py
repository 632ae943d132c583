"""Score a checkpoint with sacreBLEU: `python scripts/evaluate.py CKPT [--split test] [--beam 5]`, the
same as `seq2seq evaluate` (seq2seq.commands.evaluate; --help for every flag)."""

import sys

from seq2seq.commands.evaluate import main

if __name__ == "__main__":
    sys.exit(main())
