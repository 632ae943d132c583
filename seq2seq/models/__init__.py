"""The models, written as the textbook writes the math: attention scorers and multi-head attention,
the Bahdanau GRU translator, the Transformer, the encode/decode/step interface they share, building one
from its `model_args`, and the readable training loss they are specified by (`reference`).

`kernels/` holds the speed paths (chunked and recomputed scorers, the unpacked encoder, deferred
gradients, dropout masks, the compiled loops); `kernels.accelerate(model)` plugs them into a built
model, and the modules here never import them.

May import: torch and the top-level basics (seq2seq.errors, seq2seq.checkpoint's file format) only.
"""
