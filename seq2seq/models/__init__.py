"""The models: attention scorers and multi-head attention, the Bahdanau GRU translator, the Transformer,
the compiled decoder loop, the encode/decode/step interface they share, and building one from its
`model_args`.

May import: torch and the top-level basics (seq2seq.errors, seq2seq.checkpoint's file format) only.
"""
