"""Using a trained model: greedy and beam search, loading a checkpoint into a model, the `Translator`
API (translations, n-best lists, attention, word alignments), and the flags evaluate.py and
translate.py share.

May import: seq2seq.alignment, seq2seq.data, seq2seq.models and the basics.
"""
