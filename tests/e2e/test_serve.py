"""The translation server's page in Chromium, driven by Playwright: typed text gets each model's
translation, heatmap and word links, an n-best entry its own attention, a reference its reading.

The server runs on 127.0.0.1 on a port the OS picks (tests/unit/serving/test_serve.py's fixtures).
"""

import shutil
from pathlib import Path
from typing import Any

from seq2seq.decoding.translator import Translator
from tests.unit.serving.test_serve import (
    PAIRS,
    paths,  # noqa: F401 (a fixture, used by name)
    server,  # noqa: F401 (a fixture, used by name)
    transformer_checkpoint,  # noqa: F401 (a fixture `paths` uses)
)


def chromium_page(playwright: Any) -> Any:
    """A page in Debian's headless chromium (no browser download: Playwright drives the system's)."""
    chromium = shutil.which("chromium")
    assert chromium, "the browser test needs Debian's chromium: apt-get install chromium"
    browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.set_default_timeout(20_000)  # every wait for the page has a deadline
    return page


def panels_of(page: Any) -> list[list[Any]]:
    """Per model panel: its name, heatmap cells, word links and translation."""
    return page.eval_on_selector_all(
        ".model",
        """panels => panels.map(panel => [
        panel.dataset.model,
        panel.querySelectorAll('svg.heatmap rect[data-i]').length,
        panel.querySelectorAll('.links line').length,
        panel.querySelector('.translation').textContent])""",
    )


def readout_under_pointer(page: Any, panel: int, i: int, j: int) -> str:
    """The pointer on cell (output i, source j) of panel `panel`'s heatmap: its readout."""
    model = page.locator(".model").nth(panel)
    model.locator(f"svg.heatmap rect[data-i='{i}'][data-j='{j}']").hover()
    return model.locator(".readout").text_content()


# both panels show the reference as their translation: the teacher-forced answer is in
SHOWING = """reference => [...document.querySelectorAll('.model .translation')]
    .every(e => e.textContent === reference)"""


def expected_panels(found: dict[str, Any]) -> list[list[Any]]:
    return [
        [name, len(hyp.src_tokens) * len(hyp.tgt_tokens), len(hyp.word_alignment), hyp.text]
        for name, hyp in found.items()
    ]


def reading(hyp: Any, i: int, j: int) -> str:
    """The readout the page shows for `hyp`'s cell (i, j): the answer's 4 digits."""
    return f"{hyp.tgt_tokens[i]} ← {hyp.src_tokens[j]}: {hyp.to_dict(4)['attention'][i][j]:.4f}"


def test_page_translates_typed_text_and_reads_references_in_chromium(
    server: str,  # noqa: F811 (the fixtures imported above)
    paths: dict[str, Path],  # noqa: F811
) -> None:
    """Typed into the page: a sentence gets each model's translation, heatmap (a cell per pair of
    subwords, the weight under the pointer) and word links; a clicked n-best entry shows its own
    attention; teacher-forced, each model reads the typed reference."""
    from playwright.sync_api import sync_playwright

    translators = {name: Translator.load(path) for name, path in paths.items()}
    source, reference = PAIRS[0]
    with sync_playwright() as playwright:
        page = chromium_page(playwright)
        page.goto(server + "/")
        page.wait_for_function(
            "document.getElementById('about').textContent.startsWith('Models: gru')"
        )
        page.locator("#source").press_sequentially(source)  # key by key, as typed
        page.locator("#go").click()
        page.wait_for_function(
            "[...document.querySelectorAll('.model .translation')].filter(e => e.textContent)"
            ".length === 2"
        )
        translated = panels_of(page)
        pointed = readout_under_pointer(page, 0, 1, 0)

        page.locator("#nbest").fill("3")  # beam 5 (the page's default), n-best 3
        page.locator("#go").click()
        page.wait_for_selector(".model ol.nbest li:nth-child(3)")
        page.locator(".model").nth(0).locator("ol.nbest li").nth(2).click()
        third = readout_under_pointer(page, 0, 0, 0)

        page.locator("#forced").check()
        page.locator("#reference").press_sequentially(reference)
        assert page.locator("#go").text_content() == "Align"
        page.locator("#go").click()
        page.wait_for_function(SHOWING, arg=reference)
        forced = panels_of(page)
        forced_pointed = readout_under_pointer(page, 1, 0, 1)
        address = page.evaluate("location.search")
    found = {
        name: t.translate([source], return_alignments=True, nbest=3)[0]
        for name, t in translators.items()
    }  # the page asks for beam 5, the default
    assert translated == expected_panels(found)  # n-best 3 of beam 5 leads with beam 5's best
    assert translated[0][2] > 0  # the trained GRU links words
    assert pointed == reading(found["gru"], 1, 0)
    assert third == reading(found["gru"].nbest[2], 0, 0)  # the third hypothesis's own attention
    read = {name: t.align([source], [reference])[0] for name, t in translators.items()}
    assert forced == expected_panels(read) and [p[3] for p in forced] == [reference] * 2
    assert forced_pointed == reading(read["transformer"], 0, 1)
    assert "ref=" in address  # the address carries the form: a link to it runs it again
