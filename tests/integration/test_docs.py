"""The docs: the generated reference pages are current with the code, the README stays a landing
page, every guide is in the site's navigation and every link of the README and the changelog
points to a file that exists."""

from __future__ import annotations

import importlib.util
import re
from types import ModuleType

import yaml
from conftest import ROOT

from trainadvisor.options import table

DOCS = ROOT / "docs"
LINK = re.compile(r"\]\((?!https?://|#|mailto:)([^)#]+)(?:#[^)]*)?\)")


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_docs", ROOT / "scripts" / "gen_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_generated_reference_pages_are_what_the_code_says_now() -> None:
    pages = _generator().pages()
    stale = [
        str(p.relative_to(ROOT)) for p, text in pages.items() if not p.is_file() or p.read_text() != text
    ]
    extra = sorted(str(p.relative_to(ROOT)) for p in set((DOCS / "reference").rglob("*.md")) - set(pages))
    assert (stale, extra) == ([], []), "run: .venv/bin/python scripts/gen_docs.py"


def test_the_cli_reference_holds_every_option_of_every_command_with_its_help() -> None:
    page = _generator().cli_page()
    for name, options in table.TABLES.items():
        assert f"## trainadvisor {name}" in page
        for option in options:
            assert f"`{option.flag}" in page, option.flag
            assert _generator().cell(option.help) in page, option.flag


def test_the_readme_is_a_landing_page() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200
    text = "\n".join(lines)
    for command in (
        "bash scripts/demo.sh",
        "bash scripts/test.sh",
        "trainadvisor profile",
        "trainadvisor analyze",
    ):
        assert command in text
    assert "@advise" in text and "trainadvisor compare" in text


def test_every_guide_is_in_the_sites_navigation() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())

    def listed(entries: list) -> set[str]:  # type: ignore[type-arg]
        found: set[str] = set()
        for entry in entries:
            for value in entry.values() if isinstance(entry, dict) else [entry]:
                found |= listed(value) if isinstance(value, list) else {value}
        return found

    guides = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md") if "reference" not in p.parts}
    assert guides <= listed(config["nav"])


def test_every_link_of_the_readme_and_the_changelog_reaches_a_file() -> None:
    for name in ("README.md", "CHANGELOG.md"):
        targets = LINK.findall((ROOT / name).read_text())
        assert targets, name
        missing = [t for t in targets if not (ROOT / t).exists()]
        assert missing == [], name
