"""Seeded studies: the spec and its checks, the study folder and each run's state, the scheduler,
running `seq2seq train` as child processes, scoring a finished run, reading its TensorBoard events,
and the report.

May import: every layer below it (training, decoding, alignment, data, models, basics); never
seq2seq.serving.
"""
