"""seq2seq: attention-based neural machine translation on PyTorch Lightning."""

__version__ = "0.1.0"
