"""`python -m seq2seq COMMAND ...`: the command lines of seq2seq.commands (`--help` lists them)."""

import sys

from seq2seq.commands import main

if __name__ == "__main__":
    sys.exit(main())
