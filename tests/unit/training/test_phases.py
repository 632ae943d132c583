"""`train` is its phases in order, each a named function of seq2seq.training.phases short enough to
read in one screen, so a profile of a whole run names where its time goes."""

import inspect

from seq2seq.training import phases, run

PHASES = ("plan_run", "run_callbacks", "build_trainer", "check_trainer", "prepared_data",
          "system_for", "fit", "report_end")  # fmt: skip


def test_train_calls_its_phases_in_order_and_each_fits_a_screen() -> None:
    body = inspect.getsource(run.train)
    assert len(body.splitlines()) <= 40
    called = [body.index(f"{name}(") for name in PHASES]
    assert called == sorted(called)
    for name in PHASES:
        phase = getattr(phases, name)
        assert phase.__doc__, name
        assert len(inspect.getsource(phase).splitlines()) <= 50, name
    assert "import" not in inspect.getsource(phases.plan_run)  # imports stay at the module's top


def test_the_model_is_named_by_its_textbook_class_not_its_kernel() -> None:
    from seq2seq.models.build import build_model
    from seq2seq.models.kernels import accelerate

    model = build_model({"model": "rnn", "vocab_size": 30, "emb_size": 8, "hidden_size": 8})
    count = sum(p.numel() for p in model.parameters())
    accelerate(model)
    assert type(model).__name__ != "RNNSeq2Seq"  # a kernel now
    assert phases.model_line(model) == f"Model: RNNSeq2Seq, {count:,} parameters"
