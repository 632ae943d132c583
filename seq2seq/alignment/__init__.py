"""Reading attention: word alignments from subword attention, Pharaoh files, AER, symmetrisation, the
statistics of how sharp attention is, and heatmap figures.

May import: seq2seq.data, seq2seq.models and the basics.
"""
