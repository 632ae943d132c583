"""Draw the attention of one sentence, one panel per checkpoint: `python scripts/plot_attention.py
CKPT [CKPT ...] --out FILE`, the same as `seq2seq plot-attention` (seq2seq.commands.plot_attention)."""

import sys

from seq2seq.commands.plot_attention import main

if __name__ == "__main__":
    sys.exit(main())
