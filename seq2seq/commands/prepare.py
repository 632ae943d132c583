"""Prepare a corpus for training once, beforehand: `seq2seq prepare [train flags]` (or
`python scripts/prepare.py ...`).

Streams the corpus, trains the joint sentencepiece model on a seeded sample (`--spm-sample`; or uses
`--spm-model`), encodes every split in `--prepare-workers` processes and writes the cache into
`--cache-dir`, all or nothing. It takes train.py's flags, so the same flags name the same cache:
`train.py` with them finds it ready and starts training at once (it prepares the cache itself when
it is cold). Flags that do not concern the data are accepted and ignored. Run it once per cache
before a multi-process or multi-machine job; a second run finds the cache and only reports it.
"""

import sys

from seq2seq.cli import cli_message
from seq2seq.errors import UserError
from seq2seq.training.config import parse_args


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    try:
        cfg = parse_args(argv, prog)
        from seq2seq.data.prepare import prepare

        prepared = prepare(cfg)
    except UserError as err:
        print(f"error: {cli_message(err)}", file=sys.stderr)
        return 2
    state = "built" if prepared.built else "already prepared"
    total = sum(f.stat().st_size for p in prepared.paths.values() for f in p.iterdir())
    print(f"{prepared.location} ({cfg.src}-{cfg.tgt}), {state}: cache {cfg.cache_dir}")
    for role, path in prepared.paths.items():
        meta = prepared.meta[role]
        size = sum(f.stat().st_size for f in path.iterdir())
        print(
            f"  {role:5} {meta['rows']:>12,} pairs  {size / 2**20:10,.1f} MB  "
            f"{size / max(meta['rows'], 1):6.0f} bytes/pair  {path}"
        )
    print(f"  tokenizer ({prepared.tokenizer.vocab_size:,} pieces) {prepared.tokenizer_file}")
    print(f"  {total / 2**20:,.1f} MB of encoded splits in all")
    return 0
