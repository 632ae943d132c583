import dataclasses
import re
import shlex

import pytest
import yaml

from seq2seq.cli import check_fields, per_model_fields
from seq2seq.data.config import DataConfig, order_fields
from seq2seq.decoding.flags import decoding_parser, search_config
from seq2seq.errors import UserError
from seq2seq.models.build import build_model, model_args_from, model_keys
from seq2seq.models.config import ModelConfig
from seq2seq.recipes import CLASSIC_RNN, RECIPES, RNN_0_3
from seq2seq.training.config import (
    OptimConfig,
    RunConfig,
    TrainConfig,
    ValidationConfig,
    build_parser,
    parse_args,
    validate,
)
from tests.conftest import ROOT


def test_defaults_need_no_flags() -> None:
    cfg = parse_args([])
    assert cfg == TrainConfig()
    assert cfg.name == "rnn-additive"


def test_a_decoder_variant_runs_in_a_folder_of_its_own() -> None:
    """`--decoder cgru` beside the default with the same scorer: their versions must not interleave."""
    assert parse_args(["--decoder", "cgru", "--score", "dot"]).name == "rnn-cgru-dot"
    assert parse_args(["--decoder", "bahdanau", "--score", "dot"]).name == "rnn-dot"
    assert parse_args(["--model", "transformer"]).name == "transformer"


SHARED = [name for name in per_model_fields(TrainConfig) if name in RECIPES["transformer"]]


@pytest.mark.parametrize("name", SHARED)
def test_a_recipe_setting_defaults_per_model_unless_given(name: str, tmp_path) -> None:
    flag = "--" + name.replace("_", "-")
    rnn, transformer = RECIPES["rnn"][name], RECIPES["transformer"][name]
    assert getattr(parse_args([]), name) == rnn
    assert getattr(parse_args(["--model", "transformer"]), name) == transformer
    # Given, it wins, even when it is the other model's default.
    assert getattr(parse_args(["--model", "transformer", flag, str(rnn)]), name) == rnn
    assert getattr(parse_args([flag, str(transformer)]), name) == transformer
    path = tmp_path / "run.yaml"
    path.write_text("model: transformer\n")
    assert getattr(parse_args(["--config", str(path)]), name) == transformer
    path.write_text(f"model: transformer\n{name}: {rnn}\n")
    assert getattr(parse_args(["--config", str(path)]), name) == rnn
    # hparams.yaml holds the resolved value, so it rebuilds the same run; a library caller's
    # config, and a layer's part alone (the GRU's, having no model), resolve the same way.
    saved = dataclasses.asdict(parse_args(["--model", "transformer"]))
    assert getattr(TrainConfig(**saved), name) == transformer
    assert getattr(TrainConfig(model="transformer"), name) == transformer
    (owner,) = [p for p in PARTS if name in {f.name for f in dataclasses.fields(p)}]
    assert getattr(owner(), name) == rnn


def test_the_gru_only_recipe_setting_follows_the_gru_and_means_nothing_to_the_transformer() -> None:
    """`--emb-size` is the GRU's (0.4.0: 512); the Transformer's width is `--d-model`, and its model
    takes no embedding size (one given is refused: the next test)."""
    assert [n for n in per_model_fields(TrainConfig) if n not in SHARED] == ["emb_size"]
    assert parse_args([]).emb_size == RECIPES["rnn"]["emb_size"] == 512
    assert parse_args(["--emb-size", "256"]).emb_size == 256
    assert "emb_size" not in model_args_from(parse_args(["--model", "transformer"]), vocab_size=100)
    assert model_args_from(parse_args([]), vocab_size=100)["emb_size"] == 512


@pytest.mark.parametrize(
    ("model", "flags", "said"),
    [
        ("transformer", ["--decoder", "cgru"], "--decoder cgru: a setting of --model rnn,"),
        ("transformer", ["--score", "dot"], "--score dot: a setting of --model rnn,"),
        ("transformer", ["--emb-size", "64"], "--emb-size 64: a setting of --model rnn,"),
        ("transformer", ["--hidden-size", "1024"], "--hidden-size 1024: a setting of --model rnn,"),
        ("transformer", ["--attn-size", "64"], "--attn-size 64: a setting of --model rnn,"),
        ("transformer", ["--enc-layers", "2"], "--enc-layers 2: a setting of --model rnn,"),
        ("rnn", ["--d-model", "128"], "--d-model 128: a setting of --model transformer,"),
        ("rnn", ["--heads", "8"], "--heads 8: a setting of --model transformer,"),
        ("rnn", ["--layers", "4"], "--layers 4: a setting of --model transformer,"),
        ("rnn", ["--ff-size", "256"], "--ff-size 256: a setting of --model transformer,"),
        ("rnn", ["--post-ln"], "--post-ln: a setting of --model transformer,"),
        (
            "rnn",
            ["--alignment-layer", "0"],
            "--alignment-layer 0: a setting of --model transformer,",
        ),
        (
            "rnn",
            ["--alignment-heads", "0"],
            "--alignment-heads 0: a setting of --model transformer,",
        ),
    ],
)
def test_a_setting_only_the_other_model_reads_is_refused_not_ignored(model, flags, said) -> None:
    """`--model transformer --hidden-size 1024` trained the default Transformer, the size unread.
    Each setting one kind's constructor takes and the other's does not is refused when set, from
    the flags and from a library caller's config alike; at the value it has unset it means nothing
    either way and passes (a study's shared flags may name it)."""
    with pytest.raises(UserError, match=f"^{re.escape(said)} which --model {model} does not read"):
        parse_args(["--model", model, *flags])
    field = flags[0].removeprefix("--").replace("-", "_")
    value = True if len(flags) == 1 else int(flags[1]) if flags[1].isdigit() else flags[1]
    with pytest.raises(UserError, match=f"^`{field}`"):
        validate(TrainConfig(model=model, **{field: value}))
    unset = getattr(TrainConfig(model=model), field)
    assert getattr(validate(TrainConfig(model=model, **{field: unset})), field) == unset
    assert set(model_keys("rnn")) ^ set(model_keys("transformer")) == {
        "score", "decoder", "emb_size", "hidden_size", "attn_size", "enc_layers", "d_model",
        "heads", "layers", "ff_size", "post_ln", "alignment_layer", "alignment_heads",
    }  # fmt: skip  # every one of them is in the list above


@pytest.mark.parametrize(
    ("comment", "recipe"),
    [("# the GRU's recipe before 0.3.0", CLASSIC_RNN), ("# the GRU's recipe of 0.3.0", RNN_0_3)],
)
def test_the_gru_recipes_before_are_the_flag_sets_the_readme_gives(comment, recipe) -> None:
    """Each recipe setting of the GRU changed with the search or after it, and README's Train line
    for each earlier recipe parses to it: `CLASSIC_RNN` (0.2), `RNN_0_3` (`--emb-size 256`)."""
    changed = {name for name in CLASSIC_RNN if RECIPES["rnn"][name] != CLASSIC_RNN[name]}
    assert changed == set(per_model_fields(TrainConfig))
    assert {name for name in RNN_0_3 if RECIPES["rnn"][name] != RNN_0_3[name]} == {"emb_size"}
    readme = (ROOT / "README.md").read_text("utf-8").splitlines()
    [line] = [line for line in readme if line.endswith(comment)]
    flags = shlex.split(line.split("#")[0])[2:]  # after `python scripts/train.py`
    assert parse_args(flags) == TrainConfig(**recipe, score="additive")


def test_every_field_has_a_flag_with_its_default_in_help() -> None:
    text = build_parser().format_help()
    for f in dataclasses.fields(TrainConfig):
        assert "--" + f.name.replace("_", "-") in text
    assert "{additive,dot,scaled}" in text and "(default: 8000)" in text
    # A default that depends on the model is given for each, not shown as None.
    flat = " ".join(text.split())
    for name in per_model_fields(TrainConfig):
        each = ", ".join(f"{v[name]} for {kind}" for kind, v in RECIPES.items() if name in v)
        assert f"(default: {each})" in flat and f"{each}) (default" not in flat
    assert "(default: 512 for rnn)" in flat


def test_flags_override_yaml_which_overrides_defaults(tmp_path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("score: dot\nbatch-tokens: 512\nlr: 3.0e-4\ntie_embeddings: false\n")
    cfg = parse_args(["--config", str(path), "--batch-tokens", "1024"])
    assert (cfg.score, cfg.batch_tokens, cfg.lr, cfg.tie_embeddings) == ("dot", 1024, 3e-4, False)


def test_unknown_yaml_key_is_named(tmp_path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("scroe: dot\n")
    with pytest.raises(UserError, match="unknown key.*scroe"):
        parse_args(["--config", str(path)])


def test_bad_choice_in_yaml_names_the_flag(tmp_path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("score: cosine\n")
    with pytest.raises(UserError, match="line 1: score must be one of additive, dot, scaled"):
        parse_args(["--config", str(path)])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "lr: 0.01\nbatch-tokens: lots\n",
            "line 2: batch-tokens must be a whole number, got 'lots'",
        ),
        ("batch_tokens: 2048.5\n", "line 1: batch_tokens must be a whole number, got 2048.5"),
        ("lr: fast\n", "line 1: lr must be a number, got 'fast'"),
        ("tie_embeddings: 1\n", "line 1: tie_embeddings must be true or false, got 1"),
        ("max_len: yes\n", "line 1: max_len must be a whole number, got True"),
        ("src: [de, fr]\n", "line 1: src must be a string, got ['de', 'fr']"),
        ("seed:\n", "line 1: seed needs a value"),
        ("lr: 0.01\nseed: 3\nlr: 0.5\n", "line 3: 'lr' is given twice (line 1 too); keep one"),
        (
            "max-epochs: 2\nmax_epochs: 5\n",
            "line 2: 'max_epochs' is given twice (line 1 too); keep one",
        ),
    ],
)
def test_yaml_values_are_checked_against_the_fields_types(tmp_path, text, message) -> None:
    path = tmp_path / "run.yaml"
    path.write_text(text)
    with pytest.raises(UserError) as caught:
        parse_args(["--config", str(path)])
    assert str(caught.value) == f"--config {path} {message}"


def test_yaml_floats_in_e_notation_are_numbers(tmp_path) -> None:
    # YAML 1.1 reads `1e-3` (no dot) as a string; it is how most people write a learning rate.
    path = tmp_path / "run.yaml"
    path.write_text("lr: 1e-3\nmin_lr_ratio: 5E-2\nlabel_smoothing: .1\nmax_minutes: 1e1\n")
    cfg = parse_args(["--config", str(path)])
    assert (cfg.lr, cfg.min_lr_ratio, cfg.label_smoothing, cfg.max_minutes) == (
        1e-3,
        5e-2,
        0.1,
        10.0,
    )


def test_yaml_whole_numbers_serve_where_floats_or_strings_are_expected(tmp_path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("devices: 2\nlr: 1\nlimit_train_pairs: null\n")
    cfg = parse_args(["--config", str(path)])
    assert (cfg.devices, cfg.lr, cfg.limit_train_pairs) == ("2", 1.0, None)
    assert isinstance(cfg.lr, float)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--batch-tokens", "0"], "--batch-tokens must be positive"),
        (["--dropout", "1.5"], "--dropout must be in"),
        (["--hidden-size", "63"], "--hidden-size must be even"),
        (["--max-steps", "0"], "--max-steps must be positive or -1"),
        (["--src", "en", "--tgt", "en"], "--src and --tgt"),
        (["--max-minutes", "0"], "--max-minutes must be positive"),
        (["--keep-best", "0"], "--keep-best must be positive"),
    ],
)
def test_out_of_range_flags_are_named(argv: list[str], message: str) -> None:
    with pytest.raises(UserError, match=message):
        parse_args(argv)


def test_bad_choice_on_the_command_line_exits_2(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--score", "cosine"])
    assert exit_info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_resume_takes_an_optional_path() -> None:
    assert parse_args(["--resume"]).resume == "latest"
    assert parse_args(["--resume", "x.ckpt"]).resume == "x.ckpt"
    assert parse_args([]).resume is None


def test_decoding_flags_come_from_search_config_and_errors_name_the_flag() -> None:
    parser = decoding_parser("test")
    search = search_config(parser.parse_args(["--beam", "4", "--length-penalty", "0.6"]))
    assert (search.beam, search.length_penalty, search.nbest) == (4, 0.6, 1)
    assert "(default: 1.5)" in parser.format_help()  # --max-len-ratio, from SearchConfig's default
    for argv, flag in ((["--beam", "0"], "--beam"), (["--max-len-ratio", "0"], "--max-len-ratio"),
                       (["--beam", "2", "--nbest", "3"], "--nbest"), (["--batch-size", "0"],
                       "--batch-size")):  # fmt: skip
        with pytest.raises(UserError, match=f"^{flag} "):
            search_config(parser.parse_args(argv))


PARTS = (ModelConfig, DataConfig, OptimConfig, ValidationConfig, RunConfig)


def test_each_setting_is_declared_in_one_part_and_the_parts_make_the_whole() -> None:
    """A field declared in two parts would silently shadow the other: each is stated once."""
    declared = [name for part in PARTS for name in part.__annotations__]
    assert len(declared) == len(set(declared))
    assert set(declared) == {f.name for f in dataclasses.fields(TrainConfig)}
    assert all(isinstance(TrainConfig(), part) for part in PARTS)


def test_help_has_one_section_per_part_in_the_order_of_the_layers() -> None:
    text = build_parser().format_help()
    titles = [part.__doc__.partition(":")[0] for part in PARTS]
    assert [line[:-1] for line in text.splitlines() if line[:-1] in titles] == titles
    # A flag sits in its part's section: --seed (data) before the optimisation heading.
    body = text[text.index("\nmodel:") :]  # the sections, after the usage lines
    assert body.index("--seed SEED") < body.index("\noptimisation:") < body.index("--lr LR")


def test_every_model_setting_builds_some_model_and_each_kind_takes_its_own() -> None:
    """model_args are read off the constructors: a ModelConfig field no model takes is dead."""
    taken = set(model_keys("rnn")) | set(model_keys("transformer"))
    assert taken == {f.name for f in dataclasses.fields(ModelConfig)} - {"model"}
    assert "score" in model_keys("rnn") and "score" not in model_keys("transformer")
    assert "max_len" not in model_keys("transformer")  # the data's max_len, not the positions
    cfg = TrainConfig(model="transformer", d_model=32, heads=2, layers=1, ff_size=64)
    model = build_model(model_args_from(cfg, vocab_size=50))
    assert model.generator.out_features == 50 and len(model.encoder) == 1


def test_the_batch_order_settings_are_the_tagged_data_fields() -> None:
    assert set(order_fields()) == {
        "seed", "batch_tokens", "accumulate_grad_batches", "max_len", "limit_train_pairs"
    }  # fmt: skip


def test_a_range_stated_on_a_field_is_checked_for_library_callers_too() -> None:
    """check_fields names the setting; parse_args spells it as the flag."""
    with pytest.raises(UserError, match=r"^`word_dropout` must be in \[0, 1\), got 1.5$"):
        check_fields(OptimConfig(word_dropout=1.5))
    with pytest.raises(UserError, match=r"^--keep-last must be zero or more, got -1$"):
        parse_args(["--keep-last", "-1"])
    check_fields(DataConfig(limit_train_pairs=None))  # an unset optional setting passes


def test_train_refuses_a_library_callers_bad_config_before_writing(tmp_path) -> None:
    """train(cfg) from Python checks the settings parse_args would have: nothing is written."""
    from seq2seq.training.run import train

    logs = tmp_path / "logs"
    with pytest.raises(UserError, match=r"^`word_dropout` must be in \[0, 1\), got 1.0$"):
        train(TrainConfig(word_dropout=1.0, log_dir=str(logs)))
    assert not logs.exists()


@pytest.mark.parametrize("name", per_model_fields(TrainConfig))
def test_a_config_copied_to_another_model_takes_that_models_recipe(name: str) -> None:
    """dataclasses.replace builds the copy from the original's values: a recipe value taken, not
    given, still follows `model` there; a given one stays."""
    rnn = RECIPES["rnn"][name]
    transformer = RECIPES["transformer"].get(name, rnn)  # emb_size: the Transformer has none
    copied = dataclasses.replace(TrainConfig(), model="transformer")
    assert getattr(copied, name) == transformer == getattr(TrainConfig(model="transformer"), name)
    back = dataclasses.replace(copied, model="rnn")
    assert getattr(back, name) == rnn
    given = dataclasses.replace(TrainConfig(**{name: rnn}), model="transformer")
    assert getattr(given, name) == rnn
    assert getattr(validate(copied), name) == transformer


def test_validate_settles_the_recipe_into_plain_values_for_hparams_and_checkpoints() -> None:
    cfg = validate(TrainConfig(model="transformer"))
    values = dataclasses.asdict(cfg)
    assert all(type(values[n]) in (int, float) for n in per_model_fields(TrainConfig))
    assert yaml.safe_load(yaml.safe_dump(values)) == values  # hparams.yaml writes plain YAML
    # Settled, the values are the run's own: a copy to another model keeps them.
    assert dataclasses.replace(cfg, model="rnn").lr == RECIPES["transformer"]["lr"]
    assert parse_args(["--model", "transformer"]) == cfg


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"lr": "1e-3"}, r"^`lr` must be a number, got '1e-3'$"),
        ({"max_steps": 2.5}, r"^`max_steps` must be a whole number, got 2.5$"),
        ({"compile": "yes"}, r"^`compile` must be true or false, got 'yes'$"),
        ({"min_lr_ratio": -0.5}, r"^`min_lr_ratio` must be in \[0, 1\], got -0.5$"),
        ({"hidden_size": 63}, r"^`hidden_size` must be even"),
        ({"src": "en", "tgt": "en"}, r"^`src` and `tgt` are both 'en'$"),
    ],
)
def test_a_library_callers_bad_value_is_one_line_naming_it(settings, message) -> None:
    with pytest.raises(UserError, match=message):
        validate(TrainConfig(**settings))


def test_a_library_callers_whole_numbers_serve_as_in_yaml() -> None:
    cfg = validate(TrainConfig(devices=2, lr=1))
    assert (cfg.devices, cfg.lr) == ("2", 1.0) and isinstance(cfg.lr, float)


def test_a_negative_min_lr_ratio_is_refused_on_the_command_line() -> None:
    with pytest.raises(UserError, match=r"^--min-lr-ratio must be in \[0, 1\], got -0.5$"):
        parse_args(["--min-lr-ratio", "-0.5"])


@pytest.mark.parametrize(
    ("settings", "message"),
    [({"hidden_size": 63}, "`hidden_size` must be even"), ({"tgt": "de"}, "`src` and `tgt`"),
     ({"min_lr_ratio": 2.0}, "`min_lr_ratio`")],
)  # fmt: skip
def test_the_whole_configs_check_runs_every_parts_check(settings, message) -> None:
    """A part's `check` alone would shadow the others' on the whole config."""
    with pytest.raises(UserError, match=message):
        TrainConfig(**settings).check()
