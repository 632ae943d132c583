"""Unit tests: in-process, tiny models and data, each well under two seconds; `python -m pytest
tests/unit` is the quick loop. A test marked `slow` belongs in tests/e2e, which marks its own."""

from pathlib import Path

import pytest

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    slow = [item.nodeid for item in items
            if item.path.is_relative_to(HERE) and item.get_closest_marker("slow")]  # fmt: skip
    if slow:
        raise pytest.UsageError(f"slow tests belong in tests/e2e: {', '.join(slow)}")
