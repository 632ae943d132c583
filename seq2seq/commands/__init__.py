"""The command lines: `python -m seq2seq COMMAND ...` (or the `seq2seq` console script) and the shims
in scripts/ run these. Each module holds one command's parser and `main(argv, prog) -> int`, which
parses, calls the procedure of the layer below (seq2seq.training.run.train,
seq2seq.decoding.evaluate.evaluate, seq2seq.study.scheduler, ...) and turns its outcome into lines
and an exit status; `main` here picks the command by name.

May import: every layer (seq2seq.study, seq2seq.serving and everything below them).
"""

import importlib
import sys

from seq2seq import __version__

# name -> (module in this folder, one line for --help); a module is imported only when it runs.
COMMANDS = {
    "train": ("train", "train a translator (seq2seq.training.run)"),
    "evaluate": ("evaluate", "translate a test set and score it with sacreBLEU"),
    "translate": ("translate", "translate text, one line per line"),
    "prepare": ("prepare", "prepare a corpus's cache once, before training"),
    "average": ("average", "average the weights of checkpoints of one run"),
    "serve": ("serve", "serve checkpoints: the attention explorer and a JSON API"),
    "study": ("study", "train and score variants x seeds, with a report of significance"),
    "plot-attention": ("plot_attention", "draw one sentence's attention, a panel per checkpoint"),
    "silver-alignments": ("silver_alignments", "silver word alignments with eflomal"),
    "fit-foresight": ("foresight", "fit a foresight alignment head on a frozen GRU translator"),
}
PROG = "seq2seq"


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {about}" for name, (_, about) in COMMANDS.items()]
    return (
        f"usage: {PROG} COMMAND [flags]   ({PROG} COMMAND --help for a command's flags)\n\n"
        "Attention-based neural machine translation: train, evaluate, translate, serve, study.\n\n"
        "commands:\n" + "\n".join(lines) + "\n"
    )


def main(argv: list[str] | None = None) -> int:
    """Run the command `argv[0]` with the flags after it; its exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        (sys.stdout if argv else sys.stderr).write(usage())
        return 0 if argv else 2
    if argv[0] == "--version":
        print(f"{PROG} {__version__}")
        return 0
    name = argv[0]
    if name not in COMMANDS:
        choices = ", ".join(COMMANDS)
        print(f"{PROG}: error: unknown command {name!r} (choose from {choices}; see --help)",
              file=sys.stderr)  # fmt: skip
        return 2
    module = importlib.import_module(f"{__name__}.{COMMANDS[name][0]}")
    return module.main(argv[1:], prog=f"{PROG} {name}")
