"""The shape of the corpus of real training-log lines (tests/fixtures/joblogs/corpus/).

Every entry is one log line copied from a public report, with the report's URL, a failure
category from the issue's fixed list (or null for a benign line) and whether the line points
at the rank that printed it. This file checks the files' shape and the corpus's coverage;
how well the recogniser does on the lines is the recognition tests' business.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from sn_monitor.config import load_yaml

CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "joblogs" / "corpus"

CATEGORIES = frozenset({
    "nccl-timeout", "nccl-error", "network-error", "cuda-oom", "cuda-error", "ecc-error",
    "nan-loss", "process-killed", "segfault", "app-bug", "rendezvous-error",
    "dataloader-error", "host-oom",
})
REQUIRED = ("text", "category", "root_candidate", "source")
ALLOWED = frozenset((*REQUIRED, "note"))
URL = re.compile(r"https?://[^\s/]+\.[^\s/]+/\S*")
MIN_PER_CATEGORY = 12
# Categories allowed fewer real lines than MIN_PER_CATEGORY, with the README saying what
# was searched: none now (ecc-error, the last, has 20).
SHORT_CATEGORIES: dict[str, int] = {}
MIN_BENIGN = 80
# What a keyword matcher keys on; the benign lines are there to trip it.
NAIVE_FAILURE_WORDS = re.compile(
    r"error|fail|timeout|timed out|kill|\bnan\b|warn|abort|exception|\boom\b|out of memory"
    r"|overflow|sigterm|signal|cannot|unable|closed|disable|deadlock|fatal|exit|\[E|loss.scale"
    r"|destroy|stopped",
    re.IGNORECASE,
)

CORPUS_FILES = sorted(CORPUS.glob("*.yaml"))


def entry_problems(entry: Any) -> list[str]:
    """What is wrong with one corpus entry (empty when it is well formed)."""
    if not isinstance(entry, dict):
        return [f"an entry is a mapping, not {type(entry).__name__}"]
    problems = [f"missing {key}" for key in REQUIRED if key not in entry]
    problems += [f"unknown key {key}" for key in sorted(set(entry) - ALLOWED, key=str)]
    text = entry.get("text")
    if not isinstance(text, str) or not text.strip():
        problems.append("text is a non-empty string")
    elif "\n" in text or "\r" in text or "\x1b" in text:
        problems.append("text is one line without ANSI escapes")
    category = entry.get("category")
    if category is not None and category not in CATEGORIES:
        problems.append(f"category {category!r} is not one of the fixed categories")
    root = entry.get("root_candidate")
    if category is None and root is not None:
        problems.append("a benign line (category null) has root_candidate null")
    if category is not None and not isinstance(root, bool):
        problems.append("root_candidate is true or false for a failure line")
    source = entry.get("source")
    if not isinstance(source, str) or not URL.fullmatch(source):
        problems.append(f"source {source!r} is an http(s) URL")
    if "note" in entry and not isinstance(entry["note"], str):
        problems.append("note is a string")
    return problems


def load_entries(path: Path) -> list[Any]:
    """The entries of one corpus file (a YAML list)."""
    data = load_yaml(path).data
    assert isinstance(data, list), f"{path.name}: the file is a list of entries"
    return data


def all_entries() -> list[dict[str, Any]]:
    return [entry for path in CORPUS_FILES for entry in load_entries(path)]


GOOD = {
    "text": "[rank3]: torch.OutOfMemoryError: CUDA out of memory.",
    "category": "cuda-oom",
    "root_candidate": True,
    "source": "https://github.com/pytorch/pytorch/issues/1",
}


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"category": "oom"}, "not one of the fixed categories"),
        ({"root_candidate": None}, "true or false"),
        ({"category": None}, "root_candidate null"),
        ({"source": "github.com/pytorch/pytorch/issues/1"}, "http(s) URL"),
        ({"source": "see the thread"}, "http(s) URL"),
        ({"text": ""}, "non-empty string"),
        ({"text": "two\nlines"}, "one line"),
        ({"text": "\x1b[31mred\x1b[0m"}, "ANSI"),
        ({"severity": "high"}, "unknown key severity"),
        ({"note": 3}, "note is a string"),
    ],
)
def test_entry_problems_names_each_defect(change: dict[str, Any], problem: str) -> None:
    assert entry_problems(GOOD) == []
    found = entry_problems({**GOOD, **change})
    assert any(problem in item for item in found), found


def test_entry_problems_names_a_missing_key() -> None:
    entry = {key: value for key, value in GOOD.items() if key != "source"}
    assert "missing source" in entry_problems(entry)


def test_a_benign_entry_is_well_formed() -> None:
    benign = {**GOOD, "category": None, "root_candidate": None}
    assert entry_problems(benign) == []


def test_corpus_has_files() -> None:
    assert CORPUS_FILES, f"no corpus files in {CORPUS}"


@pytest.mark.parametrize("path", CORPUS_FILES, ids=lambda path: path.name)
def test_every_entry_is_well_formed(path: Path) -> None:
    doc = load_yaml(path)
    assert isinstance(doc.data, list), f"{path.name}: the file is a list of entries"
    bad = {
        f"{path.name}:{doc.line((index,))}": problems
        for index, entry in enumerate(doc.data)
        if (problems := entry_problems(entry))
    }
    assert not bad, bad


def test_no_line_is_in_the_corpus_twice() -> None:
    counts = Counter(entry["text"] for entry in all_entries())
    assert [text for text, count in counts.items() if count > 1] == []


def test_every_category_has_enough_real_lines() -> None:
    counts = Counter(entry["category"] for entry in all_entries())
    short = {
        category: counts[category]
        for category in sorted(CATEGORIES)
        if counts[category] < SHORT_CATEGORIES.get(category, MIN_PER_CATEGORY)
    }
    assert not short, short
    assert counts[None] >= MIN_BENIGN


def test_enough_benign_lines_would_trip_a_keyword_matcher() -> None:
    benign = [entry["text"] for entry in all_entries() if entry["category"] is None]
    tripping = [text for text in benign if NAIVE_FAILURE_WORDS.search(text)]
    assert len(tripping) >= MIN_BENIGN, f"{len(tripping)} of {len(benign)} benign lines"


def test_the_readme_names_every_file() -> None:
    readme = (CORPUS / "README.md").read_text(encoding="utf-8")
    assert [path.name for path in CORPUS_FILES if path.name not in readme] == []
