"""The docs' own tools: the gallery's order and time budget (docs/gallery.py), the layout
check of docs/screenshots.py, and the settings that keep the site readable at 1280 and
390 px. Nothing here builds the docs; the timing itself is checked on the docs build's own
record (``python docs/gallery.py`` in .ci/run), never in a test."""

from __future__ import annotations

import importlib.util
import re
import shutil
from pathlib import Path

import pytest

DOCS = Path(__file__).parents[1] / "docs"
EXAMPLES = Path(__file__).parents[1] / "examples"


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"docs_{name}", DOCS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gallery = load("gallery")

SG_TIMES = """
  .. list-table::
   :header-rows: 1
   :class: table table-striped sg-datatable

   * - Example
     - Time
     - Mem (MB)
   * - :ref:`sphx_glr_auto_examples_a.py` (``../examples/a.py``)
     - 01:02.500
     - 0.0
   * - :ref:`sphx_glr_auto_examples_b.py` (``../examples/b.py``)
     - 00:03.250
     - 0.0
"""


def test_gallery_order_lists_every_example_once():
    scripts = sorted(path.name for path in EXAMPLES.glob("*.py"))
    assert sorted(gallery.ORDER) == scripts
    assert gallery.ORDER[:5] == [
        "quickstart.py",
        "plot_compare_with_sklearn.py",
        "plot_choose_k.py",
        "plot_model_selection.py",
        "pipeline_wine.py",
    ]
    assert sorted(scripts + ["new.py"], key=gallery.order)[0] == "quickstart.py"
    assert sorted(scripts + ["new.py"], key=gallery.order)[-1] == "new.py"


def test_conf_sorts_the_gallery_with_that_order():
    conf = (DOCS / "conf.py").read_text()
    assert '"within_subsection_order": "gallery.order"' in conf


def test_gallery_times_are_read_from_sphinx_gallery_table():
    assert gallery.read_times(SG_TIMES) == {"a.py": 62.5, "b.py": 3.25}


def test_gallery_budget_flags_slow_and_missing_examples():
    times = gallery.read_times(SG_TIMES)
    problems = gallery.over_budget(times, ["a.py", "b.py", "c.py"], budget_s=60)
    assert problems == ["c.py: no recorded time", "a.py: 62.5 s, over the budget of 60 s"]
    assert gallery.over_budget(times, ["a.py", "b.py"], budget_s=63) == []


def test_gallery_page_states_the_budget():
    readme = (EXAMPLES / "README.txt").read_text()
    assert f"{gallery.BUDGET_S:.0f} s" in readme


def test_navbar_entries_before_the_dropdown_are_short():
    """Five short titles, the search as an icon: the header fits one row at 1280 px (the
    layout itself is measured by docs/screenshots.py)."""
    conf = (DOCS / "conf.py").read_text()
    before = int(re.search(r'"header_links_before_dropdown": (\d+)', conf)[1])
    assert '"navbar_persistent": ["search-button"]' in conf  # an icon, not a wide field
    toctree = (DOCS / "index.md").read_text().split("```{toctree}")[1].split("```")[0]
    entries = [line for line in toctree.splitlines()[1:] if line and not line.startswith(":")]
    titles = [entry.split(" <")[0] for entry in entries[:before]]
    assert all(" <" in entry for entry in entries[:before]), "give the entries short titles"
    assert sum(len(title) for title in titles) <= 60, titles


def test_wide_tables_scroll_in_their_own_box():
    css = (DOCS / "_static" / "custom.css").read_text()
    rule = css.split(".bd-content .pst-scrollable-table-container {")[1].split("}")[0]
    assert "overflow-x: auto" in rule


@pytest.mark.skipif(
    not any(shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome")),
    reason="the layout check runs in Chromium",
)
@pytest.mark.parametrize("boxed", [False, True])
def test_layout_check_finds_a_cut_table(tmp_path, boxed):
    screenshots = load("screenshots")
    cells = "".join(f"<td>column {i}</td>" for i in range(40))
    table = f"<table><tr>{cells}</tr></table>"
    if boxed:
        table = f'<div style="overflow-x: auto">{table}</div>'
    page = tmp_path / "page.html"
    page.write_text(f"<html><body><h1>A title</h1>{table}</body></html>")
    problems = screenshots.check_page(page, False, 390, 844)
    if boxed:
        assert problems == []
    else:
        assert any("does not scroll in a box of its own" in p for p in problems), problems
        assert any("scrolls sideways" in p for p in problems), problems
