"""Each model kind's training recipe: the defaults that depend on `--model`, and where each was chosen.

A flag of a recipe setting (`--dropout`, `--word-dropout`, `--batch-tokens`, `--lr`, `--max-epochs`,
and the GRU's `--emb-size`) is declared in its layer's settings with `per_model=RECIPE[name]`
(`seq2seq.cli.option`); left unset, it takes the value of the run's `--model`. Given, it wins,
whatever the model. A setting one model kind lacks (the Transformer has `--d-model`, no `--emb-size`)
has no value for that kind.

- The GRU (`rnn`): the recipe search's winners (docs/results/study.md, "The recipe search"). 0.3.0:
  dropout 0.5, word dropout 0.1, 4,096-token batches at a peak rate of 2e-3, 30 epochs
  (`docs/study-recipe-de-en`: over seeds 1-3 on de->en 41.12 ± 0.28 BLEU against 39.80 ± 0.22 for
  the recipe before it, `CLASSIC_RNN`, Holm-adjusted p 0.012). 0.4.0: embeddings of 512 instead of
  256 (`docs/study-recipe-emb512-en-de`, against 0.3.0's recipe, `RNN_0_3`, en->de). Every earlier
  study states its recipe in its spec.
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
        "emb_size": 512,
    },
    "transformer": {
        "dropout": 0.3,
        "word_dropout": 0.0,
        "batch_tokens": 2048,
        "lr": 1e-3,
        "max_epochs": 25,
    },
}

# The GRU's recipes before: each is one flag set away (README, Train).
# 0.3.0's: `--emb-size 256`.
RNN_0_3: dict[str, float | int] = {**RECIPES["rnn"], "emb_size": 256}
# Before the search (0.2): `--emb-size 256 --dropout 0.3 --word-dropout 0 --batch-tokens 2048
# --lr 1e-3 --max-epochs 20`.
CLASSIC_RNN: dict[str, float | int] = {
    "dropout": 0.3,
    "word_dropout": 0.0,
    "batch_tokens": 2048,
    "lr": 1e-3,
    "max_epochs": 20,
    "emb_size": 256,
}

# name -> {model kind -> default}, for the kinds that have the setting: what `option(per_model=...)`
# takes.
RECIPE: dict[str, dict[str, float | int]] = {
    name: {kind: values[name] for kind, values in RECIPES.items() if name in values}
    for name in RECIPES["rnn"]
}
