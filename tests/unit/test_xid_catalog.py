"""NVIDIA's Xid catalogue as package data: what ships, the lookups, and bad user files."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from sn_monitor.cli.check_config import check_file
from sn_monitor.config import ConfigError, load_yaml
from sn_monitor.controller.settings import ControllerSettings, load_controller_settings
from sn_monitor.errors import SnMonitorError
from sn_monitor.rules.spec import load_rules, packaged_rules
from sn_monitor.rules.xid_catalog import (
    CATEGORIES,
    GPU_FATAL_RESOLUTIONS,
    PACKAGED_CATALOG,
    RESOLUTIONS,
    UNSPECIFIED,
    CatalogError,
    XidCatalog,
    XidEntry,
    gpu_fatal_codes,
    load_catalog,
)

ROOT = Path(__file__).resolve().parents[2]
HEADER = ("kind: XidCatalog\nsource: https://example.invalid/xids\n"
          "version: test 1\nentries:\n")


def _write(tmp_path: Path, entries: str, header: str = HEADER) -> Path:
    path = tmp_path / "xids.yaml"
    path.write_text(header + entries)
    return path


# ---------------------------------------------------------------- the packaged catalogue


def test_the_packaged_catalogue_loads_and_says_where_it_came_from():
    catalog = load_catalog()
    assert catalog.source == ("https://docs.nvidia.com/deploy/xid-errors/"
                              "analyzing-xid-catalog.html")
    assert "2025-09-30" in catalog.version
    assert "taken 20" in catalog.version
    assert catalog is load_catalog()  # cached
    assert load_catalog(PACKAGED_CATALOG) == catalog


def test_the_packaged_catalogue_lists_every_code_nvidia_lists():
    assert sorted(load_catalog().entries) == list(range(1, 173))


@pytest.mark.parametrize(
    ("code", "name", "resolution"),
    [
        (8, "GPU stopped processing", "RESTART_APP"),
        (13, "Graphics Engine Exception", "RESTART_APP"),
        (31, "GPU memory page fault", "RESTART_APP"),
        (43, "GPU stopped processing", "IGNORE"),  # the GPU stays healthy
        (45, None, "WORKFLOW_XID_45"),
        (46, "GPU stopped processing", "RESET_GPU"),
        (48, "Double Bit ECC Error", "WORKFLOW_XID_48"),
        (54, "Auxiliary power is not connected to the GPU board", "CHECK_MECHANICALS"),
        (62, None, "RESET_GPU"),
        (63, "GPU memory remapping event", "IGNORE"),
        (64, "GPU memory remapping failure", "RESET_GPU"),
        (74, "NVLINK Error", "WORKFLOW_NVLINK_ERR"),
        (78, "vGPU Start Error", "UPDATE_SWFW"),
        (79, "GPU has fallen off the bus", "RESTART_BM"),
        (92, "High single-bit ECC error rate", "IGNORE"),
        (94, "Contained memory error", "RESTART_APP"),
        (95, "Uncontained memory error", "RESET_GPU"),
        (109, "Context Switch Timeout Error", "RESET_GPU"),
        (119, "GSP RPC Timeout", "RESET_GPU"),
        (120, "GSP Error", "RESET_GPU"),
        (137, "NVLink Privilege Error", "IGNORE"),
        (140, "ECC Unrecovered Error", "RESET_GPU"),
        (142, "NVENC3 Error", "CONTACT_SUPPORT"),
        (144, "NVLINK: SAW Error", "WORKFLOW_NVLINK5_ERR"),
        (149, "NVLINK: NETIR Error", "WORKFLOW_NVLINK5_ERR"),
        (151, "Key rotation Error", "RESTART_VM"),
        (154, "GPU Recovery Action Changed", "XID_154"),
        (159, "CHI Non-Data Error", "CHECK_UVM"),
        (1, "Unused", "CONTACT_SUPPORT"),
        (167, "PCIE_FATAL_TIMEOUT", UNSPECIFIED),  # the catalogue leaves it blank
    ],
)
def test_codes_carry_the_published_resolution(code, name, resolution):
    entry = load_catalog().get(code)
    assert entry is not None
    assert entry.code == code
    assert entry.resolution == resolution
    if name is not None:
        assert entry.name == name


def test_the_bucket_counts_of_the_published_revision():
    counts = Counter(e.resolution for e in load_catalog().entries.values())
    assert counts == {
        "CONTACT_SUPPORT": 62, "RESTART_APP": 48, "IGNORE": 21, "RESET_GPU": 14,
        UNSPECIFIED: 11, "WORKFLOW_NVLINK5_ERR": 7, "WORKFLOW_XID_45": 1,
        "WORKFLOW_XID_48": 1, "CHECK_MECHANICALS": 1, "WORKFLOW_NVLINK_ERR": 1,
        "UPDATE_SWFW": 1, "RESTART_BM": 1, "RESTART_VM": 1, "XID_154": 1, "CHECK_UVM": 1,
    }


def test_every_entry_is_complete_and_uses_known_names():
    for entry in load_catalog().entries.values():
        assert entry.resolution in RESOLUTIONS, entry
        assert entry.category in CATEGORIES, entry
        assert entry.name, entry
        assert entry.why, entry
        assert "\n" not in entry.why, entry


def test_the_codes_nvidia_leaves_blank_say_so():
    catalog = load_catalog()
    blank = catalog.codes([UNSPECIFIED])
    assert blank == frozenset(range(162, 173))
    for code in blank:
        assert "no " in catalog.get(code).why or "neither" in catalog.get(code).why  # type: ignore[union-attr]


def test_codes_by_resolution():
    catalog = load_catalog()
    assert catalog.codes(["RESTART_BM"]) == {79}
    reset = catalog.codes(["RESET_GPU"])
    assert {46, 62, 64, 95, 109, 119, 120, 140, 158} <= reset
    assert not reset & {13, 31, 43, 45, 94}
    app = catalog.codes(["RESTART_APP"])
    assert {13, 31, 94} <= app
    assert not app & {43, 45}
    assert catalog.codes(["RESET_GPU", "RESTART_BM"]) == reset | {79}
    assert catalog.codes([]) == frozenset()
    assert catalog.codes(iter(["RESTART_VM"])) == {151}


def test_codes_refuses_names_that_are_not_buckets():
    catalog = load_catalog()
    with pytest.raises(ValueError, match="unknown resolution 'REBOOT'"):
        catalog.codes(["RESET_GPU", "REBOOT"])
    with pytest.raises(TypeError, match="not the string 'RESET_GPU'"):
        catalog.codes("RESET_GPU")


def test_describe():
    catalog = load_catalog()
    assert catalog.describe(13).startswith(
        "XID 13 (Graphics Engine Exception): NVIDIA's resolution RESTART_APP — ")
    assert "the GPU is fine" in catalog.describe(13)
    assert catalog.describe(79).startswith(
        "XID 79 (GPU has fallen off the bus): NVIDIA's resolution RESTART_BM — ")
    assert catalog.describe(167).startswith(
        "XID 167 (PCIE_FATAL_TIMEOUT): NVIDIA's catalogue gives no resolution — ")
    assert catalog.describe(999) == (f"XID 999: not in NVIDIA's Xid catalogue "
                                     f"({catalog.version})")


def test_entries_cannot_be_changed():
    catalog = load_catalog()
    with pytest.raises(TypeError):
        catalog.entries[13] = XidEntry(13, "x", "IGNORE", "x")  # type: ignore[index]


def test_the_packaged_rules_directory_still_loads_as_rules():
    # The catalogue sits in the packaged rules directory; the rules loader passes over it.
    names = {rule.name for rule in load_rules([packaged_rules()])}
    assert "fatal-xid" in names


def test_the_codes_the_agent_counts_from_zero_are_the_fatal_xid_rules():
    """The agent exports these codes at 0 on every GPU; the fatal-xid rule acts on them."""
    (fatal,) = [r for r in load_rules([packaged_rules()]) if r.name == "fatal-xid"]
    assert set(fatal.resolutions) == GPU_FATAL_RESOLUTIONS
    assert gpu_fatal_codes() == load_catalog().codes(fatal.resolutions)
    assert len(gpu_fatal_codes()) == 19  # series per GPU: say so in the docs if it changes


def test_a_catalogue_named_as_a_rule_file_is_refused(tmp_path):
    with pytest.raises(ConfigError):
        load_rules([PACKAGED_CATALOG])


# ---------------------------------------------------------------- a user's file


def test_a_user_catalogue_loads(tmp_path):
    path = _write(tmp_path, "  - {code: 45, name: Preemptive cleanup, resolution: IGNORE,\n"
                            "     why: follows another XID here}\n"
                            "  - {code: 13, name: GR exception, resolution: RESTART_APP,\n"
                            "     why: the app's fault, category: application}\n")
    catalog = load_catalog(path)
    assert isinstance(catalog, XidCatalog)
    assert catalog.version == "test 1"
    assert list(catalog.entries) == [13, 45]
    assert catalog.get(45) == XidEntry(45, "Preemptive cleanup", "IGNORE",
                                       "follows another XID here")
    assert catalog.get(13).category == "application"  # type: ignore[union-attr]
    assert catalog.codes(["IGNORE"]) == {45}


ENTRY = "  - {code: 13, name: x, resolution: RESTART_APP, why: y}\n"


@pytest.mark.parametrize(
    ("entries", "header", "message"),
    [
        (ENTRY + "  - {code: 14, name: x, resolution: RESTART, why: y}\n", HEADER,
         ":6: entries[1].resolution: unknown resolution 'RESTART' (NVIDIA's buckets: "),
        (ENTRY + "  - {code: 8, name: x, resolution: IGNORE, why: y}\n" + ENTRY, HEADER,
         ":7: entries[2].code: duplicate code 13 (first at line 5)"),
        ("  - {code: 13, name: x, why: y}\n", HEADER,
         ":5: entries[0]: missing required key 'resolution'"),
        ("  - {code: '13', name: x, resolution: IGNORE, why: y}\n", HEADER,
         ":5: entries[0].code: expected an integer, got '13'"),
        ("  - {code: 0, name: x, resolution: IGNORE, why: y}\n", HEADER,
         ":5: entries[0].code: must be greater than 0, got 0"),
        ("  - {code: 13, name: x, resolution: IGNORE, why: '', category: application}\n",
         HEADER, ":5: entries[0].why: must not be empty"),
        ("  - {code: 13, name: x, resolution: IGNORE, why: y, category: gpu}\n", HEADER,
         ":5: entries[0].category: unknown category 'gpu'"),
        ("  - {code: 13, name: x, resolution: IGNORE, why: y, action: reset}\n", HEADER,
         ":5: entries[0].action: unknown key (known keys: category, code, name, "
         "resolution, why)"),
        (ENTRY, HEADER.replace("version: test 1\n", ""), ":1: missing required key 'version'"),
        ("  []\n", HEADER, ":4: entries: lists no XID codes"),
        (ENTRY, HEADER.replace("XidCatalog", "XidCatalogue"),
         ":1: kind: must be XidCatalog; got 'XidCatalogue'"),
        ("  - {code: 13, name: x, resolution: IGNORE, why: [y]\n", HEADER, ":6: invalid YAML"),
    ],
)
def test_a_bad_user_catalogue_names_file_key_and_line(tmp_path, entries, header, message):
    path = _write(tmp_path, entries, header)
    with pytest.raises(CatalogError) as caught:
        load_catalog(path)
    assert str(caught.value).startswith(f"{path}{message}")
    assert isinstance(caught.value, SnMonitorError)


def test_a_missing_catalogue_is_a_catalog_error(tmp_path):
    with pytest.raises(CatalogError, match=r"nope.yaml: no such file"):
        load_catalog(tmp_path / "nope.yaml")


# ---------------------------------------------------------------- the controller's setting


def test_the_controller_defaults_to_the_packaged_catalogue():
    assert ControllerSettings().xid_catalog is None


def test_the_controller_checks_its_catalogue_at_load(tmp_path):
    good = _write(tmp_path, ENTRY)
    config = tmp_path / "controller.yaml"
    config.write_text(f"state_dir: {tmp_path}\nxid_catalog: {good}\n")
    assert load_controller_settings(config).xid_catalog == str(good)

    bad = tmp_path / "bad-xids.yaml"
    bad.write_text(HEADER + "  - {code: 13, name: x, resolution: REBOOT, why: y}\n")
    config.write_text(f"state_dir: {tmp_path}\nxid_catalog: {bad}\n")
    with pytest.raises(ConfigError) as caught:
        load_controller_settings(config)
    assert str(caught.value).startswith(
        f"{config}:2: xid_catalog: not a usable XID catalogue: {bad}:5: "
        "entries[0].resolution: unknown resolution 'REBOOT'")

    config.write_text(f"state_dir: {tmp_path}\nxid_catalog: {tmp_path / 'none.yaml'}\n")
    with pytest.raises(ConfigError, match=r"controller.yaml:2: xid_catalog: .*none.yaml: "
                                          r"no such file"):
        load_controller_settings(config)


# ---------------------------------------------------------------- check-config


def test_check_config_knows_a_catalogue(tmp_path):
    assert check_file(PACKAGED_CATALOG) == "xid catalog"
    assert check_file(_write(tmp_path, ENTRY)) == "xid catalog"
    no_kind = _write(tmp_path, ENTRY, HEADER.replace("kind: XidCatalog\n", ""))
    with pytest.raises(CatalogError, match=r":1: missing required key 'kind'"):
        check_file(no_kind)
    assert load_yaml(PACKAGED_CATALOG).data["kind"] == "XidCatalog"


def test_check_config_on_a_good_and_a_bad_catalogue(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(HEADER + ENTRY + ENTRY)
    result = subprocess.run(
        [sys.executable, "-m", "sn_monitor.cli", "check-config", str(PACKAGED_CATALOG),
         str(bad)],
        capture_output=True, text=True, check=False, timeout=60, cwd=ROOT,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert f"{PACKAGED_CATALOG}: ok (xid catalog)" in result.stdout
    assert (f"{bad}:6: entries[1].code: duplicate code 13 (first at line 5)"
            in result.stderr)
