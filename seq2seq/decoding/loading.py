"""A trained model and its tokenizer from a checkpoint file alone: `load_model(path)`."""

from pathlib import Path

from seq2seq.checkpoint import model_weights, read_checkpoint
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.errors import UserError
from seq2seq.models.build import build_model
from seq2seq.models.interface import Seq2Seq
from seq2seq.models.kernels import accelerate


def load_model(path: str | Path, map_location: str = "cpu") -> tuple[Seq2Seq, Tokenizer]:
    """The trained model (eval mode, its kernels plugged in: seq2seq.models.kernels) and its
    tokenizer, from a checkpoint file alone.

    A missing, truncated or foreign file, or weights that do not fit, is a UserError naming it.
    """
    checkpoint = read_checkpoint(path, map_location)
    try:
        model = build_model(checkpoint["model_args"])
        model.load_state_dict(model_weights(checkpoint))
        tokenizer = Tokenizer.from_bytes(checkpoint["tokenizer"])
    except UserError as err:
        raise UserError(f"{path}: {err}") from None
    except (RuntimeError, TypeError, ValueError) as err:
        raise UserError(
            f"{path}: weights do not fit this version of seq2seq ({str(err).splitlines()[0]})"
        ) from None
    return accelerate(model).to(map_location).eval(), tokenizer
