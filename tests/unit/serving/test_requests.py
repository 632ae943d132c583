"""What a /api/translate body means where it leaves a setting out (seq2seq/serving/requests.py)."""

import pytest

from seq2seq.decoding.search_config import SearchConfig
from seq2seq.serving.requests import Limits, translate_request


def test_a_request_without_beam_or_nbest_takes_the_search_defaults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The server, evaluate.py and translate.py search alike unless asked otherwise: the server
    reads its defaults from SearchConfig, not a copy of them."""
    request = translate_request({"sentences": ["Ein Hund läuft ."]}, Limits(), ["m"])
    assert (request.search.beam, request.search.nbest) == (SearchConfig.beam, SearchConfig.nbest)
    monkeypatch.setattr(SearchConfig, "beam", 7)
    monkeypatch.setattr(SearchConfig, "nbest", 2)
    request = translate_request({"sentences": ["Ein Hund läuft ."]}, Limits(), ["m"])
    assert (request.search.beam, request.search.nbest) == (7, 2)
    given = translate_request({"sentences": ["Ein Hund ."], "beam": 3, "nbest": 1}, Limits(), ["m"])
    assert (given.search.beam, given.search.nbest) == (3, 1)
