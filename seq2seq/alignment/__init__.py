"""Reading attention: word alignments from subword attention, Pharaoh files, AER, symmetrisation, the
statistics of how sharp attention is, heatmap figures, and silver alignments (eflomal's links).

May import: seq2seq.data, seq2seq.models and the basics.
"""
