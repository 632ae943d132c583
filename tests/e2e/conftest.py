"""End-to-end tests: the program run as its users run it (the `train` command training, `python -m
seq2seq`, scripts, torchrun and server processes, the browser, real kills and stops), what needs the
checkpoint of a real training run (`tiny_checkpoint`), and whatever else takes seconds. Every test
here is `slow`, so `pytest -m "not slow"` runs tests/unit alone."""

from pathlib import Path

import pytest

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:  # every item of the session: this folder's alone are marked
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.slow)
