"""The benchmarks: training and decoding speed (`speed`), memory (`memory`), large corpora (`scale`),
their plots (`plots`) and a profile of one update (`profile`). Each module is a program with
`main(argv) -> int`, run as `python scripts/benchmark.py` (and the other shims in scripts/) or
`python -m seq2seq.benchmarks.<module>`; docs/results/benchmarks.md holds what they measured.

May import: every layer (seq2seq.commands and everything below it).
"""
