"""The HTML report in a real headless browser (Debian's chromium, driven by Playwright): it loads
from disk with no network, logs no console error, shows its key parts, and prints. The
screenshot and the PDF are kept for a person to look at, in $TRAINADVISOR_TEST_OUTPUT (or pytest's
temporary folder, never in the repository).

`.ci/run` installs chromium; elsewhere the test is skipped, saying why, when no browser can be
found."""

from __future__ import annotations

import os
import shutil
import struct
import zlib
from pathlib import Path

import pytest
from conftest import DATA

from trainadvisor.report.render import load_report, write_report
from trainadvisor.resources import templates_dir

BROWSER = shutil.which("chromium") or shutil.which("chromium-browser")
# `page_of_report` starts a browser once per process that asks for it: one group, so that under
# pytest -n one worker starts it, not each worker its own
pytestmark = pytest.mark.xdist_group("browser")
ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync",
]  # fmt: skip


@pytest.fixture(scope="module")
def page_of_report(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    if BROWSER is None:
        pytest.skip("no chromium on this machine (.ci/run installs Debian's chromium package)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (dev extras)")
    folder = tmp_path_factory.mktemp("report")
    write_report(load_report(DATA / "report"), folder, templates_dir())
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=BROWSER, args=ARGS)
        page = browser.new_page(viewport={"width": 1366, "height": 800})  # a laptop screen
        problems: list[str] = []
        page.on(
            "console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None
        )
        page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
        page.on(
            "request", lambda r: None if r.url.startswith("file://") else problems.append(f"request: {r.url}")
        )
        page.goto((folder / "report.html").as_uri(), wait_until="load")
        yield page, problems, folder
        browser.close()


def test_the_report_loads_offline_without_errors(page_of_report) -> None:  # type: ignore[no-untyped-def]
    page, problems, folder = page_of_report
    assert problems == []
    assert (folder / "report.html").stat().st_size < 2_000_000


def test_the_key_parts_are_visible(page_of_report) -> None:  # type: ignore[no-untyped-def]
    page, _, _ = page_of_report
    assert page.locator(".headline").inner_text().startswith("6.70x faster in steps/s")
    for heading in ("Before and after", "Findings", "Fixes, measured", "Did training stay the same?"):
        assert page.get_by_role("heading", name=heading).is_visible(), heading
    assert page.locator("svg").count() >= 3 and page.locator("svg").first.is_visible()
    assert page.locator(".finding .sev-high").first.is_visible()
    diff = page.locator("pre.diff")
    assert diff.is_visible() and "\n-        num_workers=args.num_workers,\n" in diff.inner_text()
    # Nothing overflows a laptop screen sideways.
    assert page.evaluate("document.documentElement.scrollWidth") <= 1366


def _png_pixels(data: bytes) -> bytes:
    """The decompressed image data of a PNG (its IDAT chunks): enough to see it is not blank."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    position, chunks = 8, []
    while position < len(data):
        (length,) = struct.unpack(">I", data[position : position + 4])
        kind = data[position + 4 : position + 8]
        if kind == b"IDAT":
            chunks.append(data[position + 8 : position + 8 + length])
        position += 12 + length
    return zlib.decompress(b"".join(chunks))


def test_a_screenshot_and_a_printout_are_kept(page_of_report, tmp_path_factory) -> None:  # type: ignore[no-untyped-def]
    page, _, _ = page_of_report
    output = Path(os.environ.get("TRAINADVISOR_TEST_OUTPUT") or tmp_path_factory.mktemp("browser"))
    output.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(output / "report.png"), full_page=True)
    page.pdf(path=str(output / "report.pdf"), format="A4", print_background=True)
    # A blank page is one colour: the report has text, bars and charts in many shades.
    assert len(set(_png_pixels((output / "report.png").read_bytes()))) > 32
    assert (output / "report.pdf").read_bytes()[:5] == b"%PDF-"
