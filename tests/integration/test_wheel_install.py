"""The package as users install it: a wheel built from this checkout, installed into fresh
virtual environments outside it, without the kubernetes extra and with it, and every
command run from a directory that is not the checkout (``tests/install/smoke.py``; with
the extra, the checks it changes: the commands, the shipped configs, the Kubernetes
driver). The kubelet extra goes with the kubernetes one: the kubelet source's HTTP/2 client
loads with what it installs, and without it the source names the extra.

Tests talk only to loopback, so the installs are offline: the dependencies come from
``WHEELHOUSE``, a folder of their wheels that ``make test`` fills first (``make
wheelhouse``). Without it these tests are skipped; ``make test`` (and so CI) always sets it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.install import smoke

pytestmark = pytest.mark.integration

#: What the wheel must carry besides the modules: the default rules, the XID catalogue,
#: the scenarios, the typing marker, the demo's training loop, the topology page and the
#: kubelet's API definition.
PACKAGE_DATA = ("sn_monitor/rules/default.yaml", "sn_monitor/rules/xid_catalog.yaml",
                "sn_monitor/joblog/signatures.yaml",
                "sn_monitor/sim/scenarios/default.yaml",
                "sn_monitor/sim/scenarios/thermal.yaml", "sn_monitor/py.typed",
                "sn_monitor/sim/train.py", "sn_monitor/sim/launcher.py",
                "sn_monitor/controller/api/ui/topology.html",
                "sn_monitor/agent/workloads/kubelet/v1/api.proto")


@pytest.fixture(scope="module")
def wheelhouse() -> Path:
    where = os.environ.get("WHEELHOUSE")
    if not where:
        pytest.skip("WHEELHOUSE is not set: run `make test` (it builds the wheelhouse)")
    path = Path(where)
    assert any(path.glob("*.whl")), f"WHEELHOUSE={where} holds no wheels: make wheelhouse"
    return path


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel of this checkout, built offline with the venv's own setuptools."""
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "--no-build-isolation", "--no-index", "--wheel-dir", str(out), str(ROOT)],
                   check=True, capture_output=True, timeout=300)
    (built,) = out.glob("sn_monitor-*.whl")
    return built


def test_the_wheel_carries_the_package_data(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [name for name in PACKAGE_DATA if name not in names]
    assert not missing, f"not in {wheel.name}: {missing}"
    assert not [n for n in names if n.startswith(("tests/", "bench/", "deploy/"))]


@pytest.mark.parametrize("kubernetes", [False, True], ids=["no-extras", "kubernetes"])
def test_every_command_runs_from_a_wheel_install(wheel: Path, wheelhouse: Path,
                                                 tmp_path: Path, kubernetes: bool) -> None:
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    requirement = f"{wheel}[kubernetes,kubelet]" if kubernetes else str(wheel)
    subprocess.run([str(env_dir / "bin" / "pip"), "install", "--quiet", "--no-index",
                    "--no-cache-dir", "--find-links", str(wheelhouse), requirement],
                   check=True, capture_output=True, timeout=600,
                   env={k: v for k, v in os.environ.items()
                        if not k.startswith("PIP_") and k != "PYTHONPATH"})
    steps: list[str] = []
    smoke.run(env_dir, ROOT / "deploy", kubernetes=kubernetes, extra_only=kubernetes,
              say=steps.append)
    assert len(steps) == (3 if kubernetes else 6), steps
    why = kubelet_source_says(env_dir, tmp_path)
    assert why.startswith("cannot reach the kubelet" if kubernetes
                          else "the kubelet extra is not installed (h2 is missing)"), why


#: The kubelet source asked once, in an installed package, on a socket nobody listens on.
ASK_THE_KUBELET = """\
import socket, sys
from pathlib import Path
from sn_monitor.agent.workloads.kubelet import KubeletSource
from sn_monitor.agent.workloads.model import SourceUnavailable
path = Path(sys.argv[1])
with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as dead:
    dead.bind(str(path))
try:
    KubeletSource(path).allocations()
except SourceUnavailable as err:
    print(err.why)
"""


def kubelet_source_says(env_dir: Path, work: Path) -> str:
    """Why the installed kubelet source could not answer (run from ``work``)."""
    done = subprocess.run([str(env_dir / "bin" / "python"), "-c", ASK_THE_KUBELET,
                           str(work / "kubelet.sock")], cwd=work, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()
