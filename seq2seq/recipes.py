"""Each model kind's training recipe: the defaults that depend on `--model`, and where each was chosen.

A flag of a recipe setting (`--dropout`, `--word-dropout`, `--batch-tokens`, `--lr`, `--max-epochs`)
is declared in its layer's settings with `per_model=RECIPE[name]` (`seq2seq.cli.option`); left unset,
it takes the value of the run's `--model`. Given, it wins, whatever the model.

- The GRU (`rnn`): the recipe search's winner, `docs/study-recipe-de-en` (docs/results/study.md, "The
  recipe search"): dropout 0.5, word dropout 0.1, 4,096-token batches at a peak rate of 2e-3, 30
  epochs. Over seeds 1-3 on de->en it scored 41.12 ± 0.28 BLEU against 39.80 ± 0.22 for the recipe
  before it, `CLASSIC_RNN` (Holm-adjusted p 0.012), which every earlier study trained with and now
  states in its spec.
- The Transformer: the recipe every study of it trained with; its search has not ended. Its 25
  epochs: in a GPU run planned for 40, validation BLEU levelled off after about 22.
"""

RECIPES: dict[str, dict[str, float | int]] = {
    "rnn": {
        "dropout": 0.5,
        "word_dropout": 0.1,
        "batch_tokens": 4096,
        "lr": 2e-3,
        "max_epochs": 30,
    },
    "transformer": {
        "dropout": 0.3,
        "word_dropout": 0.0,
        "batch_tokens": 2048,
        "lr": 1e-3,
        "max_epochs": 25,
    },
}

# The GRU's defaults before the search: `--dropout 0.3 --word-dropout 0 --batch-tokens 2048 --lr 1e-3
# --max-epochs 20` trains it (README, Train).
CLASSIC_RNN: dict[str, float | int] = {
    "dropout": 0.3,
    "word_dropout": 0.0,
    "batch_tokens": 2048,
    "lr": 1e-3,
    "max_epochs": 20,
}

# name -> {model kind -> default}: what `option(per_model=...)` takes.
RECIPE: dict[str, dict[str, float | int]] = {
    name: {kind: values[name] for kind, values in RECIPES.items()} for name in RECIPES["rnn"]
}
