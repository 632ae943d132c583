"""seq2seq: attention-based neural machine translation on PyTorch Lightning.

`from seq2seq import Translator, load_model` is the API for trained models; both load lazily, so
importing the package stays cheap.
"""

__version__ = "0.4.0"
__all__ = ["Translator", "load_model"]


def __getattr__(name: str):  # PEP 562: import torch and friends only when asked for
    if name == "Translator":
        from seq2seq.decoding.translator import Translator

        return Translator
    if name == "load_model":
        from seq2seq.decoding.loading import load_model

        return load_model
    raise AttributeError(f"module 'seq2seq' has no attribute {name!r}")
