"""The Kubernetes client is an optional extra: everything else imports and runs without it.

Each test runs a fresh interpreter in which ``import kubernetes`` fails, as on a plain
``pip install sn-monitor`` (the wheel test, test_wheel_install.py, does it for real).
The import contracts (.importlinter) say which modules may import the client and who may
import those; this checks that nothing imports them at module level.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

#: The modules that talk to the Kubernetes API (the import contracts allow them the client).
KUBERNETES_MODULES = frozenset({
    "sn_monitor.controller.k8s.client",
    "sn_monitor.controller.actions.drivers.kubernetes",
    "sn_monitor.controller.actions.drivers.k8s_jobs",
    "sn_monitor.controller.ha.k8s_lease",
    "sn_monitor.controller.ha.k8s_role",
    "sn_monitor.controller.k8s.job_api",
})

NO_KUBERNETES = """\
import sys
sys.modules["kubernetes"] = None  # import kubernetes -> ImportError, find_spec -> None
"""


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", NO_KUBERNETES + textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=120, check=False)


def test_every_other_module_imports_without_the_client() -> None:
    done = _run(f"""
        import importlib, pkgutil, sn_monitor
        skip = {sorted(KUBERNETES_MODULES)!r}
        names = [m.name for m in pkgutil.walk_packages(sn_monitor.__path__, "sn_monitor.")
                 if m.name not in skip]
        for name in names:
            importlib.import_module(name)
        loaded = sorted(set(skip) & set(sys.modules))
        assert not loaded, loaded
        print(len(names))
    """)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) > 90


def test_the_controller_builds_its_drivers_without_the_client() -> None:
    done = _run("""
        from sn_monitor.clock import ManualClock
        from sn_monitor.controller.actions.routing import DriverSettings, build_drivers
        drivers = build_drivers(DriverSettings(), {}, ManualClock())
        print(sorted(drivers.by_action))
        drivers.close()
    """)
    assert done.returncode == 0, done.stderr
    assert "evict" in done.stdout


def test_configuring_a_kubernetes_part_names_the_extra(tmp_path) -> None:
    """Loading the config for a controller fails naming the extra; check-config, which may
    run on another machine than the controller's, passes with one note naming it."""
    config = tmp_path / "controller.yaml"
    config.write_text("drivers:\n  kubernetes: {host: 'http://127.0.0.1:9'}\n"
                      "store: {backend: postgresql}\n"
                      "ha: {lease: kubernetes}\n")
    load = subprocess.run(
        [sys.executable, "-c", NO_KUBERNETES
         + "from sn_monitor.config import ConfigError\n"
         + "from sn_monitor.controller.settings import load_controller_settings\n"
         + f"try:\n    load_controller_settings({str(config)!r})\n"
         + "except ConfigError as err:\n    print(err)\n"],
        capture_output=True, text=True, timeout=120, check=False)
    assert load.stdout.strip() == (
        f"{config}:2: drivers.kubernetes: needs the Kubernetes client, which is not "
        "installed: pip install 'sn-monitor[kubernetes]'"), load.stdout + load.stderr
    done = subprocess.run(
        [sys.executable, "-c", NO_KUBERNETES + "from sn_monitor.cli import main\n"
         f"sys.exit(main(['check-config', {str(config)!r}]))"],
        capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    notes = [line for line in done.stdout.splitlines() if line.startswith(f"{config}: note:")]
    assert len(notes) == 1, done.stdout
    assert "pip install 'sn-monitor[kubernetes]'" in notes[0]
    assert "Traceback" not in done.stderr
