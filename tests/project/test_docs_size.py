"""The documentation a newcomer reads (issue 46): a README of one screen, docs pages of at most 800
lines, an index of every page, and no link or section reference that leads nowhere.

* README.md ≤ 300 lines, its quick start ≤ 15 lines with the two commands verbatim (CI runs the
  second: ``.ci/run``), and its algorithm table names every preset;
* every ``docs/*.md`` ≤ 800 lines, each listed once by ``docs/index.md``;
* every relative Markdown link of README.md and docs/ reaches a file, and its ``#anchor`` a heading
  of that file (GitHub's slugs); every docs/<page>.md named in the repository exists;
* every "docs/<page>.md §N" / "docs/<page>.md section N" in the repository (code, tests, benchmarks,
  examples, docs) names a page that exists and a section that page holds; section numbers moved
  with their sections when methods.md and evidence.md were split by topic.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README_MAX, PAGE_MAX, QUICK_START_MAX = 300, 800, 15
COMMANDS = ("pip install . && fedtune sweep", 'pip install -e ".[test]" && python -m pytest -q')
LINK = re.compile(r"\[(?:[^\]]|\][^(])*\]\(([^)\s]+)\)")
SECTION_REF = re.compile(r"docs/([\w-]+\.md)\)?\s*(?:§\s?|section )(\d+)((?:\.\d+)?[a-z]?)")


def pages() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def prose(path: Path) -> list[str]:
    """The file's lines outside fenced code blocks (a link inside code is code)."""
    out, fenced = [], False
    for line in lines(path):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            out.append(line)
    return out


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.lstrip("#").strip())  # a linked heading: its text
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: Counter[str] = Counter()
    out = set()
    for line in prose(path):
        if re.match(r"#{1,6} ", line):
            base = slug(line)
            out.add(base if not seen[base] else f"{base}-{seen[base]}")
            seen[base] += 1
    return out


def section(text: list[str], title: str) -> list[str]:
    start = text.index(title)
    end = next((i for i in range(start + 1, len(text)) if text[i].startswith("## ")), len(text))
    return text[start:end]


# ------------------------------------------------------------------------------------------ sizes
def test_the_readme_is_one_screen():
    n = len(lines(ROOT / "README.md"))
    assert n <= README_MAX, f"README.md has {n} lines, at most {README_MAX}: move the detail to docs/"


@pytest.mark.parametrize("page", [p.name for p in pages()])
def test_a_docs_page_is_at_most_800_lines(page):
    n = len(lines(DOCS / page))
    assert n <= PAGE_MAX, f"docs/{page} has {n} lines, at most {PAGE_MAX}: split it by topic (docs/index.md lists pages)"


def test_the_quick_start_is_the_two_commands_ci_runs():
    quick = section(lines(ROOT / "README.md"), "## Quick start")
    assert len(quick) <= QUICK_START_MAX, f"the quick start has {len(quick)} lines, at most {QUICK_START_MAX}"
    assert [line for line in quick if line in COMMANDS] == list(COMMANDS), quick
    timed = [line for line in quick if line.startswith("Expected time:")]
    assert len(timed) == 2 and all(re.search(r"\d+ (s|min)\b", line) for line in timed), timed
    assert COMMANDS[1] in lines(ROOT / ".ci" / "run"), ".ci/run no longer runs the README's second command"


def test_the_readme_names_every_preset():
    from fedtune import PRESETS

    table = "\n".join(section(lines(ROOT / "README.md"), "## Algorithms"))
    named = set(re.findall(r"`([^`]+)`", table))
    assert not set(PRESETS) - named, f"README.md's algorithm table misses {sorted(set(PRESETS) - named)}"


# ------------------------------------------------------------------------------------------ the index
def test_the_index_lists_every_page_once():
    listed = [m for line in lines(DOCS / "index.md") if line.startswith("- ")
              for m in re.findall(r"^- \[[^\]]+\]\(([^)#]+)\)", line)]
    want = sorted(p.name for p in pages() if p.name != "index.md")
    assert sorted(listed) == want, (sorted(set(want) - set(listed)), [n for n, k in Counter(listed).items() if k > 1])


# ------------------------------------------------------------------------------------------ links
def link_targets() -> list[tuple[str, str]]:
    out = []
    for path in [ROOT / "README.md", *pages()]:
        for line in prose(path):
            for target in LINK.findall(re.sub(r"`[^`]*`", "``", line)):
                if not re.match(r"[a-z]+:", target):
                    out.append((str(path.relative_to(ROOT)), target))
    return out


def test_the_links_are_found():
    targets = link_targets()
    assert len(targets) > 100 and any("#" in t for _, t in targets)
    assert slug("## 1. FedOMG — on-server matching gradient") == "1-fedomg--on-server-matching-gradient"
    assert slug("### 0.1 Streamed aggregation (since 2026-11-27)") == "01-streamed-aggregation-since-2026-11-27"


def test_every_relative_link_reaches_a_file_and_a_heading():
    broken = []
    for source, target in link_targets():
        file, _, anchor = target.partition("#")
        path = (ROOT / source).parent / file if file else ROOT / source
        if not path.exists():
            broken.append(f"{source}: {target} (no such file)")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(f"{source}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


# ------------------------------------------------------------------------------------------ section references
def section_refs() -> list[tuple[str, str, str]]:
    out = []
    for folder in ("fedtune", "tests", "benchmarks", "examples", "docs", ".ci"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix not in {".py", ".md", ".yaml", ".yml", ""} or not path.is_file():
                continue
            text = path.read_text(encoding="utf-8", errors="replace")
            for m in SECTION_REF.finditer(text):
                out.append((str(path.relative_to(ROOT)), m[1], m[2] + m[3]))
    return out


def test_the_section_references_are_found():
    refs = section_refs()
    assert len(refs) > 80
    assert any(page == "methods-server.md" and num == "25" for _, page, num in refs)  # FedEx's help strings


def test_every_section_reference_names_a_section_of_its_page():
    missing = []
    for source, page, number in section_refs():
        path = DOCS / page
        if not path.exists():
            missing.append(f"{source}: docs/{page} §{number} (no such page)")
            continue
        text = lines(path)
        major = number.split(".")[0]
        if major == "0" and number in {"0", "0.1"}:
            heads = [line for line in text if line in ("## Notation and conventions",) or line.startswith("### 0.1 ")]
        else:
            heads = [line for line in text
                     if re.match(rf"#{{2,4}} {re.escape(number)}(\.|\s)", line) or line.startswith(f"### {number} ")]
        if not heads:
            missing.append(f"{source}: docs/{page} §{number} (the page has no such section)")
    assert not missing, "\n".join(missing)


def test_every_docs_page_the_repository_names_exists():
    named = re.compile(r"(?<![\w/.])docs/([\w-]+\.md)")
    missing = []
    for folder in ("fedtune", "tests", "benchmarks", "examples", "docs", ".ci"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.is_file() and path.suffix in {".py", ".md", ".yaml", ".yml", ""}:
                text = path.read_text(encoding="utf-8", errors="replace")
                missing += [f"{path.relative_to(ROOT)}: docs/{m}" for m in named.findall(text) if not (DOCS / m).exists()]
    assert not missing, "\n".join(missing)
