"""The models, written as the textbook writes the math: attention scorers and multi-head attention,
the GRU translator with its decoders (Bahdanau's, whose step is the seam a variant overrides, and the
conditional GRU), the Transformer, the encode/decode/step interface they share, and building one from
its `model_args`. The training loss written out step by step, which the benchmark times as the
textbook path, is seq2seq.benchmarks.reference.

`kernels/` holds the speed paths (chunked and recomputed scorers, the unpacked encoder, deferred
gradients, dropout masks, the compiled loops); `kernels.accelerate(model)` plugs them into a built
model, and the modules here never import them.

May import: torch and the top-level basics only (seq2seq.errors, and for `ModelConfig` seq2seq.cli's
settings and seq2seq.recipes' defaults).
"""
