"""The data: finding and streaming corpora, the sentencepiece tokenizer, the cache prepared once (and the
lock that lets one process build it), token-budget batches, the DataModule, and an aligner's word links
read and mapped onto subword pieces for guided alignment.

May import: the basics (seq2seq.models lies below it; it needs nothing there). Its settings are one
dataclass, `DataConfig` (seq2seq.data.config), which comes down as an argument (a TrainConfig is one),
never from seq2seq.training.
"""
