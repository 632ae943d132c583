"""Training: the flags (`TrainConfig`) and their checks, the procedure (`seq2seq.training.run.train`),
the LightningModule, losses (translation and guided alignment), callbacks, run folders and resuming,
stops and launch checks.

May import: seq2seq.decoding (validation BLEU), seq2seq.alignment, seq2seq.data, seq2seq.models and the
basics; never seq2seq.study or seq2seq.serving.
"""
