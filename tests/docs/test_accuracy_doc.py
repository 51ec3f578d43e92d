"""docs/ACCURACY.md is what `python benchmarks/accuracy.py --markdown` prints: the generator runs without
a refit, and the page's held-out numbers are the stored fit report's (a refit without regenerating the page
fails here)."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _generator():
    spec = importlib.util.spec_from_file_location("accuracy_doc", REPO / "benchmarks" / "accuracy_doc.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _section(text: str, title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}.*?(?=^## |\Z)", text, re.DOTALL | re.MULTILINE)
    assert match, f"no section {title!r}"
    return match.group(0)


def test_the_page_holds_the_stored_fit_reports_numbers_and_says_when_and_where_it_was_made():
    made = _generator().markdown("h200")
    page = (REPO / "docs" / "ACCURACY.md").read_text()
    for title in ("Held out", "The 90% band"):
        assert _section(page, title) == _section(made, title), f"docs/ACCURACY.md is stale: {title}"
    assert re.search(r"^Made on \d{4}-\d\d-\d\d \d\d:\d\d UTC by `python benchmarks/accuracy.py --markdown", page, re.MULTILINE)
    assert "cores" in page and "at commit" in page
    for title in ("The shipped runs, predicted by the shipped profile", "The band on runs outside the fit",
                  "Predictions committed before their runs", "Memory of every shipped run"):
        assert f"## {title}" in made
