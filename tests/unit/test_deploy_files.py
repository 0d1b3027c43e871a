"""Every file under deploy/ is accounted for, and every sn-monitor config among them passes
``check-config`` on a plain install (``import kubernetes`` fails), as a user who copies
them onto a bare-metal host runs it. The Kubernetes configs pass with a note naming the
extra there, and pass where it is installed; other tools' files are told apart.

Each file is matched by exactly one rule below: a new file under deploy/ fails the test
until it is given one, so nothing is skipped by accident.
"""

from __future__ import annotations

import fnmatch
import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path, PurePosixPath

import pytest
import yaml

from sn_monitor.cli.check_config import check_config
from tests.conftest import ROOT

DEPLOY = ROOT / "deploy"
EXTRA_HINT = "pip install 'sn-monitor[kubernetes]'"

#: sn-monitor files for any host: check-config passes with nothing optional installed.
PLAIN = ("*.yaml", "jobs/*.yaml")
#: sn-monitor files for the Kubernetes install (the image has the kubernetes extra).
KUBERNETES = ("kubernetes/config/*.yaml", "kubernetes/ha/config/*.yaml",
              "kubernetes/rules/*.yaml")
#: Not sn-monitor files, with where each kind is checked.
OTHERS = {
    "kubernetes/*.yaml": "Kubernetes objects (test_kubernetes_manifests.py)",
    "kubernetes/ha/*.yaml": "Kubernetes objects (test_kubernetes_manifests.py)",
    "kubernetes/generate.py": "the generator of three of those (its --check is a test)",
    "kubernetes/ha/README.md": "documentation",
    "prometheus/*.yml": "Prometheus configs (promtool, test_prometheus_files.py)",
    "alertmanager/*.yml": "Alertmanager config (amtool, test_prometheus_files.py)",
    "systemd/*.service": "systemd units (tests/integration/test_systemd.py)",
    "logging/vector.yaml": "Vector pipeline (vector validate, test_logging_deploy.py)",
    "logging/filebeat.yml": "Filebeat config (filebeat test config, test_logging_deploy.py)",
    "logging/index-template.json": "Elasticsearch index template (test_logging_deploy.py)",
    "logging/README.md": "documentation",
}

NO_KUBERNETES = """\
import sys
sys.modules["kubernetes"] = None  # import kubernetes -> ImportError, as on a plain install
from sn_monitor.cli import main
"""


def _matches(relative: PurePosixPath, pattern: str) -> bool:
    """``pattern`` matches ``relative`` part for part (a ``*`` never crosses a ``/``)."""
    parts = PurePosixPath(pattern).parts
    return len(parts) == len(relative.parts) and all(
        fnmatch.fnmatchcase(name, part) for name, part in zip(relative.parts, parts,
                                                             strict=True))


def _files(patterns: tuple[str, ...]) -> list[Path]:
    return sorted(p for p in DEPLOY.rglob("*") if p.is_file() and any(
        _matches(PurePosixPath(p.relative_to(DEPLOY).as_posix()), pat) for pat in patterns))


def _check_config_without_kubernetes(files: list[Path]) -> subprocess.CompletedProcess[str]:
    code = NO_KUBERNETES + textwrap.dedent(f"""
        sys.exit(main(["check-config", *{[str(f) for f in files]!r}]))
    """)
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=False)


def _configures_kubernetes(path: Path) -> bool:
    """A controller config that turns on a part talking to the Kubernetes API."""
    data = yaml.safe_load(path.read_text())
    return isinstance(data, dict) and (
        "kubernetes" in (data.get("drivers") or {})
        or bool((data.get("kubernetes") or {}).get("watch_jobs"))
        or (data.get("ha") or {}).get("lease") == "kubernetes")


def test_every_file_under_deploy_is_classified_once() -> None:
    patterns = (*PLAIN, *KUBERNETES, *OTHERS)
    for path in sorted(p for p in DEPLOY.rglob("*") if p.is_file()):
        relative = PurePosixPath(path.relative_to(DEPLOY).as_posix())
        matched = [pat for pat in patterns if _matches(relative, pat)]
        assert len(matched) == 1, f"deploy/{relative}: matched by {matched or 'no rule'}"


@pytest.mark.parametrize("pattern", ["kubernetes/*.yaml", "kubernetes/ha/*.yaml"])
def test_the_files_passed_over_as_kubernetes_objects_are_kubernetes_objects(pattern: str
                                                                            ) -> None:
    for path in _files((pattern,)):
        for doc in yaml.safe_load_all(path.read_text()):
            assert isinstance(doc, dict), path
            assert {"apiVersion", "kind"} <= doc.keys(), path


def test_every_file_under_deploy_passes_check_config_without_the_kubernetes_client(
) -> None:
    """``sn-monitor check-config`` over the whole of deploy/, as a user points it there.

    sn-monitor's own files are read and pass; other tools' files are told apart (checked
    with promtool / amtool where they are on PATH, else skipped), never read as an agent
    config; the Kubernetes configs pass with a note naming the extra.
    """
    files = sorted(p for p in DEPLOY.rglob("*") if p.is_file())
    done = _check_config_without_kubernetes(files)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    for path in _files((*PLAIN, *KUBERNETES)):
        assert f"{path}: ok (" in done.stdout, done.stdout + done.stderr
    for path in _files(tuple(OTHERS)):
        line = next(x for x in done.stdout.splitlines() if x.startswith(f"{path}: "))
        assert "not sn-monitor's" in line or "checked with" in line or "not on PATH" in line, line


def test_the_kubernetes_configs_note_the_extra_without_it_and_pass_with_it() -> None:
    files = _files(KUBERNETES)
    needing = [f for f in files if _configures_kubernetes(f)]
    assert {f.relative_to(DEPLOY).as_posix() for f in needing} == {
        "kubernetes/config/controller.yaml", "kubernetes/ha/config/controller.yaml"}
    done = _check_config_without_kubernetes(files)
    assert done.returncode == 0, done.stdout + done.stderr
    for path in needing:
        notes = [x for x in done.stdout.splitlines() if x.startswith(f"{path}: note: ")]
        assert any(EXTRA_HINT in note for note in notes), done.stdout
    if importlib.util.find_spec("kubernetes") is None:
        pytest.skip("the kubernetes extra is not installed here")
    assert check_config(files) == 0


def test_a_kubernetes_config_without_the_client_still_stops_the_controller(
        tmp_path: Path) -> None:
    """The note is check-config's only: the controller itself refuses to start."""
    config = DEPLOY / "kubernetes" / "config" / "controller.yaml"
    code = NO_KUBERNETES + textwrap.dedent(f"""
        sys.exit(main(["controller", "--config", {str(config)!r},
                       "--state-dir", {str(tmp_path)!r},
                       "--rules", {str(ROOT / "sn_monitor" / "rules")!r}]))
    """)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 2, done.stdout + done.stderr
    assert EXTRA_HINT in done.stderr
    assert "Traceback" not in done.stderr
