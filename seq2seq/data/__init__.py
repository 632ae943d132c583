"""The data: finding and streaming corpora, the sentencepiece tokenizer, the cache prepared once (and the
lock that lets one process build it), token-budget batches, the DataModule, and an aligner's word links
read and mapped onto subword pieces for guided alignment.

May import: seq2seq.models (a model constant, e.g. the Transformer's positions) and the basics. Settings
come down as arguments (`DataSettings`, which a TrainConfig satisfies), never from seq2seq.training.
"""
