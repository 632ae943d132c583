"""Run a study: variants x seeds as ordinary training runs, scored alike, with a report of
significance: `python scripts/study.py run DIR --variant NAME FLAGS ... --seeds 1 2 3`, the same as
`seq2seq study` (seq2seq.commands.study; --help for its subcommands)."""

import sys

from seq2seq.commands.study import main

if __name__ == "__main__":
    sys.exit(main())
