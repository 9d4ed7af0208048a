"""The README and docs/ stay honest: links resolve, the contract is in the repository, the
generated tables of docs/protocol.md match schemas/, no page points at a tracker the reader
does not have, and the README keeps the commands CI runs and a map to every page.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tools import protocol_doc

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]
IDS = [p.relative_to(ROOT).as_posix() for p in PAGES]

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
ISSUE = re.compile(r"\bissues?\s*#?\s*\d+|\(#\d+\)", re.I)
FENCE = re.compile(r"^```.*?^```", re.S | re.M)

TEST_COMMAND = "python -m pip install -e '.[test]' && python -m pytest"
MAIN_COMMAND = "python -m pip install . && connect-coordinator serve --data-dir ./data"


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.*)$", text, re.M)}


def links(path: Path) -> list[str]:
    return LINK.findall(FENCE.sub("", path.read_text(encoding="utf-8")))


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in links(page):
        if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        if not dest.exists() or ROOT not in (dest, *dest.parents):
            broken.append(f"{target}: no such file in the repository")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.name}")
    assert not broken, f"{page.name}: " + "; ".join(broken)


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_no_page_points_outside_the_repository(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    assert "shared/" not in text, f"{page.name} refers to a file outside the repository"
    named = set(re.findall(r"\bdocs/([\w.-]+\.md)\b", text))
    missing = sorted(n for n in named if not (ROOT / "docs" / n).exists())
    assert not missing, f"{page.name} names pages that do not exist: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_no_issue_numbers(page: Path) -> None:
    found = [m.group(0) for m in ISSUE.finditer(page.read_text(encoding="utf-8"))]
    assert not found, f"{page.name} cites a tracker the reader has no access to: {found}"


def test_readme_keeps_the_two_commands_ci_runs() -> None:
    text = README.read_text(encoding="utf-8")
    assert MAIN_COMMAND in text
    assert TEST_COMMAND in text
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert TEST_COMMAND in ci  # CI runs the README's line verbatim


def test_readme_is_short_and_maps_every_page() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 220
    mapped = {(ROOT / t.partition("#")[0]).resolve() for t in links(README)}
    unmapped = [p.name for p in DOCS if p.resolve() not in mapped]
    assert not unmapped, f"docs pages missing from the README's map: {unmapped}"


def test_protocol_doc_tables_are_generated_from_the_schemas() -> None:
    text = protocol_doc.DOC.read_text(encoding="utf-8")
    assert protocol_doc.regenerate(text) == text, "run python -m tools.protocol_doc"
    result = subprocess.run([sys.executable, "-m", "tools.protocol_doc", "--check"],
                            cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_protocol_doc_covers_every_schema_and_api() -> None:
    text = protocol_doc.DOC.read_text(encoding="utf-8")
    for path in sorted(protocol_doc.SCHEMAS.glob("*.json")):
        assert f"(`{path.stem}`," in text, f"{path.name} has no table in docs/protocol.md"
    for path in sorted((protocol_doc.SCHEMAS / "records").glob("*Key.json")):
        assert f"| {path.stem.removesuffix('Key')} |" in text, path.name


def test_protocol_doc_check_fails_on_a_stale_table(tmp_path: Path, monkeypatch) -> None:
    stale = protocol_doc.DOC.read_text(encoding="utf-8").replace(
        "| `MaxWaitMs` |", "| `MaxWaitMillis` |")
    doc = tmp_path / "protocol.md"
    doc.write_text(stale, encoding="utf-8")
    monkeypatch.setattr(protocol_doc, "DOC", doc)
    assert protocol_doc.main(["--check"]) == 1
    assert doc.read_text(encoding="utf-8") == stale  # --check writes nothing
    assert protocol_doc.main([]) == 0
    assert "| `MaxWaitMs` |" in doc.read_text(encoding="utf-8")
