"""The speed paths: kernels that plug into a built model, chosen in one place, `accelerate`.

The modules of seq2seq.models write the math as the textbook does, and a model built from them trains
and decodes correctly on its own. `accelerate(model)` swaps each submodule it has a kernel for into
that kernel, a subclass of the textbook module that keeps its parameters and computes the same numbers
(to float tolerance) faster on some device, precision or phase:

| textbook (seq2seq.models)    | kernel (here)                         | what it changes         |
|------------------------------|---------------------------------------|-------------------------|
| attention.AdditiveScorer     | additive.SigmoidAdditiveScorer        | tanh through sigmoid;   |
|                              |                                       | chunked in search;      |
|                              |                                       | recomputed in backward  |
| rnn.BiGRUEncoder             | encoder.UnpackedBiGRUEncoder          | unpacked when a CPU     |
|                              |                                       | trains                  |
| bahdanau.BahdanauDecoder     | decoder.DeferredBahdanauDecoder       | ended rows stop; CPU    |
|                              |                                       | training's gradients    |
|                              |                                       | taken once a batch      |
| cgru.ConditionalGRUDecoder   | decoder.DeferredConditionalGRUDecoder | the same, for both GRUs |
| rnn.RNNSeq2Seq               | decoder.Fp32RecurrenceRNN             | fp32 recurrence under   |
|                              |                                       | CPU autocast            |
| multihead.MultiHeadAttention | multihead.CausalFusedAttention        | a causal mask alone as  |
|                              |                                       | `is_causal`             |
| torch.nn.Dropout             | dropout.UniformDropout                | a CPU mask from uniform |
|                              |                                       | numbers                 |

With `compile=True` the GRU translator's decoder loops are also compiled (compiled.CompiledRNN), which
`accelerate` returns in place of the model. A module of another type, a scorer or decoder written in
the textbook's terms alone, is left as it is: the model trains, on its own code there.

State dict keys, copies and checkpoints are those of the textbook model: a kernel adds no parameter
and renames none. Training (`TranslationSystem`) and decoding (`load_model`) call `accelerate`; the
textbook modules never import this package (an import-linter contract).
"""

from torch import nn

from seq2seq.models.attention import AdditiveScorer
from seq2seq.models.cgru import ConditionalGRUDecoder
from seq2seq.models.kernels.additive import SigmoidAdditiveScorer
from seq2seq.models.kernels.decoder import (
    DeferredBahdanauDecoder,
    DeferredConditionalGRUDecoder,
    Fp32RecurrenceRNN,
)
from seq2seq.models.kernels.dropout import UniformDropout
from seq2seq.models.kernels.encoder import UnpackedBiGRUEncoder
from seq2seq.models.kernels.multihead import CausalFusedAttention
from seq2seq.models.multihead import MultiHeadAttention
from seq2seq.models.rnn import BahdanauDecoder, BiGRUEncoder, RNNSeq2Seq

# Exact types only: a subclass of a textbook module (someone's variant) keeps its own code.
KERNELS: dict[type[nn.Module], type[nn.Module]] = {
    AdditiveScorer: SigmoidAdditiveScorer,
    BiGRUEncoder: UnpackedBiGRUEncoder,
    BahdanauDecoder: DeferredBahdanauDecoder,
    ConditionalGRUDecoder: DeferredConditionalGRUDecoder,
    RNNSeq2Seq: Fp32RecurrenceRNN,
    MultiHeadAttention: CausalFusedAttention,
    nn.Dropout: UniformDropout,
}


def accelerate(model: nn.Module, compile: bool = False) -> nn.Module:
    """Plug the kernels into `model`, in place, and return what to run it through.

    Args:
        model: a built model (seq2seq.models.build.build_model), trained or not, on any device; or
            any module, whose submodules are swapped alike (a scorer, an attention layer).
        compile: also compile the GRU translator's decoder loops (`--compile`; RNNSeq2Seq only).

    Returns:
        `model` itself, its submodules swapped for their kernels; with `compile`, a `CompiledRNN`
        that runs it and offers the same interface. Calling it again, on the model or on what it
        returned, changes nothing.
    """
    if not isinstance(model, nn.Module):  # what an earlier call returned (a CompiledRNN)
        return model
    for module in model.modules():
        kernel = KERNELS.get(type(module))
        if kernel is not None:
            module.__class__ = kernel  # a subclass with no state of its own: nothing else to do
    if not compile:
        return model
    from seq2seq.models.kernels.compiled import CompiledRNN  # imports torch's compiler: on demand

    return CompiledRNN(model)


def textbook(model: nn.Module) -> nn.Module:
    """Undo `accelerate` in place: every kernel back to the textbook module it stands for."""
    back = {kernel: plain for plain, kernel in KERNELS.items()}
    for module in model.modules():
        plain = back.get(type(module))
        if plain is not None:
            module.__class__ = plain
    return model
