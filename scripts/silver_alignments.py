"""Silver word alignments with eflomal: `python scripts/silver_alignments.py [--split train]`, the same
as `seq2seq silver-alignments` (seq2seq.commands.silver_alignments)."""

import sys

from seq2seq.commands.silver_alignments import main

if __name__ == "__main__":
    sys.exit(main())
