"""The signature catalogue: the packaged one loads and covers every category; a bad entry
is named by file, key and line, as every config file's error is."""

from __future__ import annotations

from pathlib import Path

import pytest

from sn_monitor.joblog.catalogue import (
    PACKAGED_SIGNATURES,
    Check,
    SignatureError,
    load_catalogue,
)
from sn_monitor.joblog.model import CATEGORIES

GOOD = """\
kind: JobLogSignatures
version: test
signatures:
  - name: killed
    category: process-killed
    severity: critical
    root_candidate: true
    keywords: [exitcode]
    patterns:
      - 'exitcode: (?P<exitcode>-?\\d+)'
    checks:
      - {param: exitcode, in: [-9]}
"""


def test_the_packaged_catalogue_covers_every_category() -> None:
    catalogue = load_catalogue()
    assert catalogue.path == str(PACKAGED_SIGNATURES)
    assert {s.category for s in catalogue.signatures} == set(CATEGORIES)
    assert all(s.why for s in catalogue.signatures)


def test_a_small_catalogue_loads_with_its_checks(tmp_path: Path) -> None:
    path = tmp_path / "sig.yaml"
    path.write_text(GOOD)
    [signature] = load_catalogue(path).signatures
    assert signature.match_line("failed (exitcode: -9)") == {"exitcode": "-9"}
    assert signature.match_line("failed (exitcode: 1)") is None


@pytest.mark.parametrize(("old", "new", "line", "key", "says"), [
    ("category: process-killed", "category: killed", 5, "signatures[0].category",
     "unknown category 'killed'"),
    ("'exitcode: (?P<exitcode>-?\\d+)'", "'exitcode: (?P<exitcode>-?\\d+'", 10,
     "signatures[0].patterns[0]", "not a regular expression"),
    ("{param: exitcode, in: [-9]}", "{param: code, in: [-9]}", 12,
     "signatures[0].checks[0].param", "no pattern captures 'code'"),
    ("    keywords: [exitcode]\n", "", 4, "signatures[0]", "needs keywords"),
    ("severity: critical", "severity: fatal", 6, "signatures[0].severity", "must be one of"),
    ("name: killed", "name: Killed_It", 4, "signatures[0].name", "kebab-case"),
    ("    keywords: [exitcode]\n", "    block: traceback\n", 4, "signatures[0]",
     "has no patterns"),
])
def test_a_bad_entry_names_file_key_and_line(tmp_path: Path, old: str, new: str, line: int,
                                             key: str, says: str) -> None:
    path = tmp_path / "sig.yaml"
    assert old in GOOD
    path.write_text(GOOD.replace(old, new))
    with pytest.raises(SignatureError) as caught:
        load_catalogue(path)
    assert (caught.value.file, caught.value.line, caught.value.key) == (str(path), line, key)
    assert says in caught.value.message


def test_a_duplicate_name_points_at_the_first(tmp_path: Path) -> None:
    entry = GOOD.split("signatures:\n")[1]
    path = tmp_path / "sig.yaml"
    path.write_text(GOOD + entry)
    with pytest.raises(SignatureError, match=r"duplicate name 'killed' \(first at line 4\)"):
        load_catalogue(path)


def test_checks_compare_numbers_as_numbers_and_text_as_text() -> None:
    assert Check("code", one_of=(-9.0,)).holds({"code": "-9"})
    assert not Check("code", one_of=(-9.0,)).holds({"code": "-11"})
    assert not Check("code", one_of=(-9.0,)).holds({})
    assert Check("count", none_of=(0.0,)).holds({})
    assert not Check("count", none_of=(0.0,)).holds({"count": "0"})
    assert Check("scale", at_most=1.0).holds({"scale": "0.5"})
    assert not Check("scale", at_most=1.0).holds({"scale": "4294967296"})
    assert not Check("scale", at_least=1.0).holds({"scale": "nan-ish"})
    assert Check("exception", none_of=("ChildFailedError",)).holds({"exception": "ValueError"})
