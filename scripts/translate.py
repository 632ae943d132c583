"""Translate line by line: `python scripts/translate.py CKPT [--beam 5] < in.txt > out.txt`, the same
as `seq2seq translate` (seq2seq.commands.translate; --help for the flags and output formats)."""

import sys

from seq2seq.commands.translate import main

if __name__ == "__main__":
    sys.exit(main())
