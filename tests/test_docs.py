"""The documentation matches the code: README.md for users, docs/ for contributors, nothing outside the repo.

- README.md stays short (<= 250 lines) and starts with the two commands;
- every relative link in README.md and docs/*.md resolves to a file of the repository;
- docs/metrics.md holds the metric table exactly as ``services.common.metrics.docs_table()`` renders it, so
  every exported metric is documented with its type, unit and labels;
- no source, config or doc file refers to the ``shared`` folder beside the repository;
- no history wording (numbered work periods; that is ``git log``) in the project's Python, Markdown or YAML
  files: the word is allowed only in Ray's ``SessionName`` label, pytest's fixture scope and
  ``start_new_session``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from services.common.metrics import docs_table

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
SKIP_DIRS = {".git", ".venv", ".venv-peers", "runs", "data", "node_modules", "build"}


def _project_files(*suffixes: str) -> list[Path]:
    out = []
    for path in REPO.rglob("*"):
        rel = path.relative_to(REPO)
        if rel.parts and (rel.parts[0] in SKIP_DIRS or any(p.startswith(".") for p in rel.parts[:-1])):
            continue
        if "__pycache__" in rel.parts or "egg-info" in str(rel):
            continue
        if path.is_file() and (path.suffix in suffixes or path.name in suffixes):
            out.append(path)
    return out


def test_readme_is_short_and_starts_with_the_two_commands():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 250
    top = "\n".join(lines[:30])
    assert "make run" in top and "make test" in top


@pytest.mark.parametrize("doc", ["README.md", *sorted(p.name for p in DOCS.glob("*.md"))])
def test_relative_links_resolve(doc):
    path = REPO / doc if doc == "README.md" else DOCS / doc
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", path.read_text()):
        if re.match(r"[a-z]+://", target):
            continue
        assert (path.parent / target).exists(), f"{doc}: broken link {target}"


def test_docs_list_every_metric():
    text = (DOCS / "metrics.md").read_text()
    assert docs_table() in text, (
        "docs/metrics.md is stale: paste `python -c 'from services.common.metrics import docs_table; print(docs_table())'`"
    )


def test_nothing_refers_to_a_folder_beside_the_repo():
    needle = "../" + "shared"
    files = _project_files(".py", ".md", ".yaml", ".yml", ".toml", ".txt", "Dockerfile", "Makefile")
    hits = [str(p.relative_to(REPO)) for p in files if needle in p.read_text(errors="replace")]
    assert not hits, hits


def test_no_history_wording():
    allowed = ("SessionName", 'scope="session"', "start_new_session")
    word = re.compile(r"\bsession\b", re.IGNORECASE)
    hits = []
    for p in _project_files(".py", ".md", ".yaml"):
        for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
            if word.search(line) and not any(a in line for a in allowed):
                hits.append(f"{p.relative_to(REPO)}:{n}")
    assert not hits, hits
