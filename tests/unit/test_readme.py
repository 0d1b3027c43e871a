"""The numbers the documentation quotes about what ships are the numbers of what ships.

The documentation is README.md and the site's pages under docs/ (the reference pages,
generated from the code as the site builds, are checked by test_docs.py).
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
README = " ".join(" ".join(p.read_text(encoding="utf-8") for p in PAGES).split())
WORDS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
         "eight": 8, "nine": 9, "ten": 10}


def _quoted(noun: str) -> list[int]:
    """Every ``N <noun>`` in the documentation (N in digits or a word), line breaks ignored."""
    found = re.findall(rf"\b(\d+|{'|'.join(WORDS)}) {noun}\b", README)
    return [int(n) if n.isdigit() else WORDS[n] for n in found]


def _prometheus_rules(kind: str) -> int:
    return sum(1 for path in (ROOT / "rules" / "prometheus").glob("*.yml")
               for group in yaml.safe_load(path.read_text())["groups"]
               for rule in group["rules"] if kind in rule)


def test_the_default_rule_count() -> None:
    count = len(yaml.safe_load((ROOT / "sn_monitor" / "rules" / "default.yaml").read_text()))
    assert _quoted("default rules"), "the documentation no longer says how many default rules"
    assert set(_quoted("default rules")) == {count}


def test_the_alert_and_recording_rule_counts() -> None:
    assert _quoted("alerts") == [_prometheus_rules("alert")]
    assert _quoted("recording rules") == [_prometheus_rules("record")]


def test_the_dashboard_count() -> None:
    assert _quoted("dashboards") == [len(list((ROOT / "grafana" / "dashboards").glob("*.json")))]


def test_the_packaged_scenarios_are_the_ones_named() -> None:
    shipped = {p.stem for p in (ROOT / "sn_monitor" / "sim" / "scenarios").glob("*.yaml")}
    match = re.search(r"\b(\w+) ship in the package \(((?:`[\w-]+`,? ?)+)", README)
    assert match, "the documentation no longer lists the packaged scenarios"
    named = set(re.findall(r"`([\w-]+)`", match.group(2)))
    assert named == shipped
    assert WORDS[match.group(1)] == len(shipped)
