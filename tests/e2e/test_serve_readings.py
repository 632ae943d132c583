"""The foresight reading served: /api/models lists each model's readings; /api/translate and
/api/align take `"reading": "foresight"` for a model with a foresight head and answer as Translator
does, each result named; a model without one, the reading with alignments off, or an unknown
reading get a one-line 422 before any work; the head's work counts against the budget; the page
shows the head's reading beside the attention (Chromium).

The head is fitted for 3 updates on the tiny checkpoint: what it reads is not good, only its own.
"""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from seq2seq.commands import foresight as foresight_command
from seq2seq.decoding.translator import Translator
from seq2seq.serving.budget import MS, translate_costs
from seq2seq.serving.requests import Limits, ServedSearch
from tests.e2e.test_serve import LIMITS, PAIRS, SENTENCES, as_json, call, chromium_page, live_server
from tests.e2e.test_serve_limits import LONG


class CountingTranslator(Translator):
    """The loaded Translator, head included, counting its calls: a refused request leaves 0."""

    def __init__(self, loaded: Translator) -> None:
        super().__init__(loaded.model, loaded.tokenizer, foresight=loaded.foresight)
        self.calls = 0

    def translate(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return super().translate(*args, **kwargs)


@pytest.fixture(scope="module")
def foresight_checkpoint(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("foresight") / "fs.ckpt"
    argv = [str(tiny_checkpoint), "--out", str(out), "--steps", "3", "--batch-tokens", "200"]
    assert foresight_command.main(argv) == 0
    return out


@pytest.fixture(scope="module")
def both(tiny_checkpoint: Path, foresight_checkpoint: Path) -> dict[str, Translator]:
    """The same GRU twice: with its foresight head ("fs") and without ("gru")."""
    return {"fs": Translator.load(foresight_checkpoint), "gru": Translator.load(tiny_checkpoint)}


@pytest.fixture(scope="module")
def server(both: dict[str, Translator]) -> Iterator[str]:
    with live_server(both, LIMITS) as base:
        yield base


def test_models_say_which_readings_they_offer(server: str) -> None:
    status, answer = call(server, "/api/models")
    assert status == 200
    described = {m["name"]: (m["decoder"], m["readings"]) for m in answer["models"]}
    assert described == {
        "fs": ("bahdanau", ["attention", "foresight"]),
        "gru": ("bahdanau", ["attention"]),
    }


def test_foresight_is_answered_as_translator_reads_it(
    server: str, both: dict[str, Translator]
) -> None:
    settings = {"beam": 3, "nbest": 2}
    body = {"sentences": SENTENCES[:3], "attention": "all", "models": ["fs"], **settings}
    status, answer = call(server, "/api/translate", {**body, "reading": "foresight"})
    assert status == 200 and list(answer["results"]) == ["fs"]
    read = both["fs"].translate(
        SENTENCES[:3], return_alignments=True, reading="foresight", **settings
    )
    foreseen = answer["results"]["fs"]
    assert foreseen == as_json([r.to_dict(4) for r in read])
    plain = call(server, "/api/translate", body)[1]["results"]["fs"]
    assert [r["text"] for r in plain] == [r["text"] for r in foreseen]  # the same search
    assert {r["reading"] for r in plain} == {"attention"}
    assert {r["reading"] for r in foreseen + foreseen[0]["nbest"]} == {"foresight"}
    assert [r["attention"] for r in plain] != [r["attention"] for r in foreseen]

    references = [en for _, en in PAIRS[:3]]
    body = {"sentences": SENTENCES[:3], "references": references, "models": ["fs"]}
    status, answer = call(server, "/api/align", {**body, "reading": "foresight"})
    aligned = both["fs"].align(SENTENCES[:3], references, reading="foresight")
    assert status == 200 and answer["results"]["fs"] == as_json([r.to_dict(4) for r in aligned])


REFUSED = {
    "a model without a head": (
        "/api/translate",
        {"sentences": ["x"], "reading": "foresight"},  # every model: "gru" has none
        "reading \"foresight\": model 'gru' holds no foresight head",
    ),
    "aligning with a model without a head": (
        "/api/align",
        {"sentences": ["x"], "references": ["y"], "models": ["gru"], "reading": "foresight"},
        "reading \"foresight\": model 'gru' holds no foresight head",
    ),
    "alignments off": (
        "/api/translate",
        {"sentences": ["x"], "models": ["fs"], "reading": "foresight", "alignments": False},
        'reading "foresight" reads the alignments: send "alignments": true',
    ),
    "an unknown reading": (
        "/api/translate",
        {"sentences": ["x"], "reading": "joined"},
        'reading must be "attention" or "foresight", got "joined"',
    ),
    "a reading not a string": (
        "/api/align",
        {"sentences": ["x"], "references": ["y"], "reading": ["foresight"]},
        'reading must be "attention" or "foresight", got a list',
    ),
}


@pytest.mark.parametrize("case", REFUSED.values(), ids=REFUSED)
def test_a_reading_the_server_cannot_give_is_one_line(
    server: str, case: tuple[str, dict[str, Any], str]
) -> None:
    path, body, message = case
    status, answer = call(server, path, body)
    assert status == 422 and answer["error"].startswith(message) and "\n" not in answer["error"]


def test_the_heads_work_counts_against_the_budget(both: dict[str, Translator]) -> None:
    """The foresight reading costs more than the attention's; a budget just under its estimate
    refuses it unrun, one at it answers."""
    model = CountingTranslator(both["fs"])
    sentences = [SENTENCES[0], LONG[:150]]
    search = ServedSearch(beam=2, nbest=2, max_output=Limits().max_output)
    [plain] = translate_costs([model], sentences, search, 1)
    [foreseen] = translate_costs([model], sentences, search, 1, "foresight")
    assert foreseen.work > plain.work and foreseen.memory > plain.memory
    most = -(-foreseen.work // MS)  # the budget in whole ms that just takes it
    body = {"sentences": sentences, "beam": 2, "nbest": 2, "reading": "foresight"}
    with live_server({"fs": model}, Limits(max_work=most - 1)) as base:
        status, answer = call(base, "/api/translate", body)
        assert status == 413 and "--max-work" in answer["error"] and model.calls == 0
        assert call(base, "/api/translate", {**body, "reading": "attention"})[0] == 200
    with live_server({"fs": model}, Limits(max_work=most)) as base:
        assert call(base, "/api/translate", body)[0] == 200
    assert model.calls == 2


def translate_on_page(playwright: Any, base: str, source: str) -> Any:
    """The page of the server at `base` in Chromium, `source` typed and sent at beam 2."""
    page = chromium_page(playwright)
    page.goto(base + "/")
    page.wait_for_function("document.getElementById('about').textContent.startsWith('Models')")
    page.locator("#source").fill(source)
    page.locator("#beam").fill("2")
    page.locator("#go").click()
    return page


HEADINGS = """panel => [...panel.querySelectorAll('.view h3')].map(h => h.textContent)"""


@pytest.mark.slow
def test_page_shows_the_foresight_reading_beside_the_attention_in_chromium(
    server: str, both: dict[str, Translator]
) -> None:
    """A model with a head shows two heatmaps, the attention's and the head's, each named, and word
    links read from the head; a model without one shows its attention and links as before."""
    from playwright.sync_api import sync_playwright

    source = SENTENCES[0]
    with sync_playwright() as playwright:
        page = translate_on_page(playwright, server, source)
        page.wait_for_function(
            "[...document.querySelectorAll('.model .translation')].filter(e => e.textContent)"
            ".length === 2"
        )
        headings = [page.locator(".model").nth(k).evaluate(HEADINGS) for k in range(2)]
        maps = [page.locator(".model").nth(k).locator("svg.heatmap").count() for k in range(2)]
        links = [page.locator(".model").nth(k).locator(".links line").count() for k in range(2)]
        fs = page.locator(".model").nth(0)
        fs.locator("svg.heatmap").nth(1).locator("rect[data-i='0'][data-j='0']").hover()
        readout = fs.locator(".readout").nth(1).text_content()
    assert headings == [
        [
            "Attention",
            "Foresight (its query has read the output word)",
            "Word alignment (source → output), from the foresight",
        ],
        ["Attention", "Word alignment (source → output), from the attention"],
    ]
    assert maps == [2, 1]
    [read] = both["fs"].translate([source], beam=2, return_alignments=True, reading="foresight")
    [plain] = both["gru"].translate([source], beam=2, return_alignments=True)
    assert links == [len(read.word_alignment), len(plain.word_alignment)]
    weight = read.to_dict(4)["attention"][0][0]
    assert readout == f"{read.tgt_tokens[0]} ← {read.src_tokens[0]}: {weight:.4f}"


@pytest.mark.slow
def test_page_shows_the_attention_when_the_foresight_reading_is_over_budget_in_chromium(
    both: dict[str, Translator],
) -> None:
    """Under a --max-work that takes the attention's request but not the dearer foresight one, the
    page shows the translation and attention and says, as an error, why the head's reading is not
    there."""
    from playwright.sync_api import sync_playwright

    source = SENTENCES[0]
    search = ServedSearch(beam=2, nbest=1, max_output=Limits().max_output)
    [plain] = translate_costs([both["fs"]], [source], search, 1)
    [foreseen] = translate_costs([both["fs"]], [source], search, 1, "foresight")
    most = -(-plain.work // MS)  # whole ms: takes the attention's request
    assert most < foreseen.work / MS, "the two readings must cost a budget apart"
    with (
        live_server({"fs": both["fs"]}, Limits(max_work=most)) as base,
        sync_playwright() as playwright,
    ):
        page = translate_on_page(playwright, base, source)
        page.wait_for_function("document.querySelector('.model .translation')?.textContent")
        page.wait_for_function("document.getElementById('status').textContent")
        status = page.locator("#status")
        said, kind = status.text_content(), status.get_attribute("class")
        headings = page.locator(".model").nth(0).evaluate(HEADINGS)
        shown = page.locator(".model .translation").text_content()
    assert said.startswith("No foresight reading: 413: ") and "--max-work" in said
    assert kind == "error"
    assert headings == ["Attention", "Word alignment (source → output), from the attention"]
    assert shown == both["fs"].translate([source], beam=2)[0].text
