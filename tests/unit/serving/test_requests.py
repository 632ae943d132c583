"""What a /api/translate body means where it leaves a setting out (seq2seq/serving/requests.py)."""

import pytest

from seq2seq.decoding.search_config import SearchConfig
from seq2seq.serving.requests import Limits, RequestError, translate_request


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


@pytest.mark.parametrize("max_beam", [1, SearchConfig.beam - 1])
def test_a_request_without_beam_gets_the_largest_the_server_allows_below_the_default(
    max_beam: int,
) -> None:
    """--max-beam below the search's default: a request that names no beam is searched with the
    largest beam allowed, not refused for the default it never sent."""
    limits = Limits(max_beam=max_beam)
    request = translate_request({"sentences": ["Ein Hund läuft ."]}, limits, ["m"])
    assert (request.search.beam, request.search.nbest) == (max_beam, 1)
    with pytest.raises(RequestError, match=f"from 1 to {max_beam}, got {max_beam + 1}"):
        translate_request({"sentences": ["Ein Hund ."], "beam": max_beam + 1}, limits, ["m"])
