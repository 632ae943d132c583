"""Serve checkpoints: `python scripts/serve.py CKPT [CKPT ...] [--port 8000]`, the same as `seq2seq
serve` (seq2seq.commands.serve; needs `pip install -e ".[serve]"`)."""

import sys

from seq2seq.commands.serve import main

if __name__ == "__main__":
    sys.exit(main())
