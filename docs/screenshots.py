"""Screenshots of the built docs at a desktop and a phone width, and checks of their layout.

Needs a Chromium (Debian: ``apt-get install chromium``) and a built site::

    python -m sphinx -W --keep-going -q -b html docs docs/_build/html
    python docs/screenshots.py                       # docs/_build/html -> docs/_build/screenshots
    python docs/screenshots.py --html DIR --out DIR

For each page below, at 1280 x 900 and 390 x 844 pixels, it saves a PNG of the top of the
page (for the benchmarks page, of its widest table) for a person to look at, and has the
browser measure the laid-out page. It exits with status 1 when, at either width:

- the header takes more than one row (at the desktop width), or the project's name in it
  comes within 4 px of a button;
- the page scrolls sideways (something is wider than the window);
- a table is wider than the text and does not scroll inside its own box;
- a page title is cut;
- the front page's figure is drawn at less than 60 % of its size (labels unreadable).

The measurements run in a copy of each page (``*.layout-check.html``, in a frame of the
width checked, ``*.layout-frame.html``; both removed afterwards) with a short script added
at its end; the PNGs are of the pages as built.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from html import unescape
from pathlib import Path

WIDTHS = {"desktop": (1280, 900), "phone": (390, 844)}
# name, page, whether the screenshot shows the page's widest table (else the page's top),
# whether to check the size its figures are drawn at
PAGES = [
    ("front", "index.html", False, True),
    ("benchmarks", "benchmarks.html", True, False),
    ("api", "generated/transformer_gmm.TransformerGMM.html", False, False),
    ("gallery", "auto_examples/index.html", False, False),
]
HEADER_MAX_PX = 90  # one row of the theme's header is 64 px at the default font size
FIGURE_MIN_SCALE = 0.6

# Runs at the end of the page's body once it has loaded, in a frame of the width checked
# (a headless window is at least 500 px wide); sends what it found to the page holding the
# frame, which writes it into <pre id="layout-check"> for --dump-dom to print.
CHECK_JS = r"""
window.addEventListener("load", () => {
  const problems = [];
  const W = window.innerWidth;
  const visible = (e) => { const r = e.getBoundingClientRect();
    return r.width > 0 && r.height > 0 && getComputedStyle(e).visibility !== "hidden"; };
  const header = document.querySelector(".bd-header");
  if (header && W >= 1200 && header.getBoundingClientRect().height > HEADER_MAX_PX)
    problems.push(`the header is ${Math.round(header.getBoundingClientRect().height)} px tall:`
                  + " its entries wrap onto more than one row");
  const brand = document.querySelector(".bd-header .navbar-brand");
  if (brand) {
    const b = brand.getBoundingClientRect();
    for (const el of document.querySelectorAll(".bd-header button, .bd-header a")) {
      if (brand.contains(el) || !visible(el)) continue;
      const r = el.getBoundingClientRect();
      if (r.left < b.right + 4 && r.right > b.left - 4  // touching counts: 4 px apart at least
          && r.top < b.bottom - 1 && r.bottom > b.top + 1)
        problems.push("the project's name in the header overlaps " + JSON.stringify(
          (el.textContent || el.title || el.className).replace(/\s+/g, " ").trim().slice(0, 30)));
    }
  }
  const pageWidth = document.documentElement.scrollWidth;
  if (pageWidth > W + 1)
    problems.push(`the page is ${pageWidth} px wide in a ${W} px window: it scrolls sideways`);
  const article = document.querySelector(".bd-article") || document.body;
  const textRight = Math.min(W, article.getBoundingClientRect().right);
  const scrolls = (e) => ["auto", "scroll"].includes(getComputedStyle(e).overflowX);
  article.querySelectorAll("table").forEach((table, i) => {
    let box = table.parentElement;
    while (box && box !== article && !scrolls(box)) box = box.parentElement;
    const boxed = box && box !== article;
    const right = (boxed ? box : table).getBoundingClientRect().right;
    if (right > textRight + 1)
      problems.push(`table ${i + 1} (${table.rows[0] ? table.rows[0].cells.length : 0} columns)`
                    + ` reaches ${Math.round(right)} px, past the text's edge`
                    + ` at ${Math.round(textRight)} px`
                    + (boxed ? "" : " and does not scroll in a box of its own"));
  });
  article.querySelectorAll("h1").forEach((h1) => {
    const r = h1.getBoundingClientRect();
    if (h1.scrollWidth > h1.clientWidth + 1 || r.right > textRight + 1)
      problems.push(`the title "${h1.textContent.replace(/#$/, "").trim()}" is cut`);
  });
  if (window.CHECK_FIGURES) article.querySelectorAll("figure img").forEach((img) => {
    if (!img.naturalWidth) return;
    const scale = img.getBoundingClientRect().width / img.naturalWidth;
    if (scale < FIGURE_MIN_SCALE)
      problems.push(`the figure ${img.getAttribute("src")} is drawn at ${Math.round(100 * scale)} %`
                    + " of its size");
  });
  parent.postMessage(JSON.stringify({width: W, problems}), "*");
});
""".replace("HEADER_MAX_PX", str(HEADER_MAX_PX)).replace("FIGURE_MIN_SCALE", str(FIGURE_MIN_SCALE))

# Hides what comes before the page's widest table, so that the screenshot shows it.
WIDEST_TABLE_JS = r"""
(() => {
  let widest = null;
  document.querySelectorAll(".bd-article table").forEach((t) => {
    if (!widest || (t.rows[0] && t.rows[0].cells.length > widest.rows[0].cells.length)) widest = t;
  });
  for (let e = widest; e && e.tagName !== "ARTICLE"; e = e.parentElement)
    for (let p = e.previousElementSibling; p; p = p.previousElementSibling)
      p.style.display = "none";
})();
"""


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        if path := shutil.which(name):
            return path
    sys.exit("docs/screenshots.py needs Chromium (Debian: apt-get install chromium)")


def run_browser(args: list[str], width: int, height: int, url: str) -> str:
    with tempfile.TemporaryDirectory() as profile:
        command = [
            chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
            "--no-first-run", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--hide-scrollbars", f"--user-data-dir={profile}",
            f"--window-size={width},{height}", *args, url,
        ]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    return done.stdout


def with_script(page: Path, script: str, suffix: str) -> Path:
    """A copy of the page beside it (so its links still resolve) with a script at its end."""
    copy = page.with_name(f"{page.stem}.{suffix}.html")
    html = page.read_text(encoding="utf-8")
    copy.write_text(html.replace("</body>", f"<script>{script}</script></body>"), "utf-8")
    return copy


FRAME_HTML = """<!DOCTYPE html><html><body style="margin: 0">
<iframe src="{src}" style="width: {width}px; height: {height}px; border: 0"></iframe>
<script>window.addEventListener("message", (event) => {{
  const pre = document.createElement("pre");
  pre.id = "layout-check";
  pre.textContent = event.data;
  document.body.appendChild(pre);
}});</script></body></html>"""


def check_page(page: Path, figures: bool, width: int, height: int) -> list[str]:
    script = f"window.CHECK_FIGURES = {str(figures).lower()};\n{CHECK_JS}"
    copy = with_script(page, script, "layout-check")
    frame = page.with_name(f"{page.stem}.layout-frame.html")
    frame.write_text(FRAME_HTML.format(src=copy.name, width=width, height=height), "utf-8")
    try:
        dom = run_browser(["--virtual-time-budget=5000", "--dump-dom"], width + 100,
                          height + 100, frame.as_uri())
    finally:
        copy.unlink()
        frame.unlink()
    start = dom.find('<pre id="layout-check"')  # the theme adds attributes to a <pre>
    if start < 0:
        return ["the layout check did not run (no result in the page)"]
    text = dom[dom.index(">", start) + 1 : dom.index("</pre>", start)]
    return json.loads(unescape(text))["problems"]


def screenshot(page: Path, widest_table: bool, width: int, height: int, png: Path) -> None:
    # A screenshot of a page scrolled to a fragment comes out blank in headless Chromium,
    # so the page is shown from its top, with what comes before the table hidden.
    copy = with_script(page, WIDEST_TABLE_JS, "screenshot") if widest_table else page
    try:
        run_browser([f"--screenshot={png}"], width, height, copy.as_uri())
    finally:
        if copy != page:
            copy.unlink()


def main(argv: list[str] | None = None) -> int:
    docs = Path(__file__).parent
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--html", type=Path, default=docs / "_build" / "html")
    parser.add_argument("--out", type=Path, default=docs / "_build" / "screenshots")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    failed = 0
    for name, path, widest_table, figures in PAGES:
        page = (args.html / path).resolve()
        if not page.exists():
            print(f"{path}: not built", file=sys.stderr)
            failed += 1
            continue
        for label, (width, height) in WIDTHS.items():
            png = args.out / f"{name}_{width}.png"
            screenshot(page, widest_table, width, height, png)
            problems = check_page(page, figures, width, height)
            failed += bool(problems)
            print(f"{'FAIL' if problems else 'ok  '} {path} at {width} px ({label}): {png}")
            for problem in problems:
                print(f"       {problem}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
