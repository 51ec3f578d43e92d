"""Files the documentation and the shipped profiles name exist: a reader who follows a reference
finds the file."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from models.profile import PROFILES_DIR

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "data").glob("**/*.md")),
        *sorted((REPO / "lab").glob("**/*.md"))]
# A path inside the repository, as the docs write them: `data/...`, `docs/...`, `lab/...`, ...
PATH = re.compile(r"(?<![\w/.-])((?:data|docs|lab|benchmarks|examples|calibration|advisor|models|runs|tests)/[\w./*-]+\.\w+)")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_repository_path_a_document_names_exists(doc):
    missing = [m for m in set(PATH.findall(doc.read_text())) if "*" not in m and not (REPO / m).exists()]
    assert not missing, f"{doc.name} names files that do not exist: {sorted(missing)}"


@pytest.mark.parametrize("profile", sorted(PROFILES_DIR.glob("*.json")), ids=lambda p: p.name)
def test_raw_files_a_profile_cites_exist(profile):
    """The raw files stay in the repository as evidence (data/profiles, data/calibration), not in the package."""
    cited = set(re.findall(r"[\w.-]+\.raw\.jsonl", profile.read_text()))
    folders = (REPO / "data/profiles", REPO / "data/calibration")
    missing = [name for name in cited if not any(any(f.rglob(name)) for f in folders)]
    assert not missing, f"{profile.name} cites raw files that do not exist: {missing}"
