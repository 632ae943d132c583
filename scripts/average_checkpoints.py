"""Average the weights of checkpoints of one run, the same as `seq2seq average` (seq2seq.commands.average):

python scripts/average_checkpoints.py run/checkpoints/best-*.ckpt run/checkpoints/last.ckpt --out avg.ckpt
"""

import sys

from seq2seq.commands.average import main

if __name__ == "__main__":
    sys.exit(main())
