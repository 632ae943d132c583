"""Using a trained model: greedy and beam search, loading a checkpoint into a model, the `Translator`
API (translations, n-best lists, attention, word alignments), evaluation as a function (`evaluate`:
BLEU, chrF, AER), one sentence's attention drawn per checkpoint, translating a stream of lines,
averaging checkpoints, and the flags the evaluate and translate commands share.

May import: seq2seq.alignment, seq2seq.data, seq2seq.models and the basics.
"""
