"""Every command of an installed sn-monitor, run as a user runs it: from a directory that
is not the checkout, with nothing but what the wheel installed.

    python3 tests/install/smoke.py VENV [--kubernetes [--extra-only]] [--deploy DIR]

``VENV`` holds the installed package (``VENV/bin/sn-monitor``); ``--kubernetes`` says the
``kubernetes`` extra is installed there (then the Kubernetes configs must be accepted;
without it they must be refused with the extra to install, exit 2, no traceback);
``--extra-only`` runs only the checks the extra changes (the commands, the shipped
configs, the Kubernetes driver), for a run that has seen the rest without the extra;
``--deploy`` is the checkout's deploy/ folder (the shipped config and job files).

What it runs: ``version`` and every ``--help``; ``check-config`` on every shipped file
(deploy/, and the rules and scenarios inside the installed package); a controller with
no ``--rules`` (the packaged defaults) answering ``/readyz``; a simulated agent serving
``/metrics`` and reporting to it; the seed's DistributedJob file posted as written;
``simulate`` against it (exit 0) and against nothing (exit 1); ``demo --headless`` on a
short scenario; ``goodput`` on a day of the packaged failure catalogue. Standard library
only: it runs before anything else is installed.
Exit 0 when all of it works; on the first failure it says what and exits 1.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

# The tests' one free_port (standard library only). This script runs as a file from
# outside the checkout: the checkout's root goes last on the path, shadowing nothing.
sys.path.append(str(Path(__file__).resolve().parents[2]))
from tests.support.ports import free_port

EXTRA_HINT = "pip install 'sn-monitor[kubernetes]'"
SEED_JOB = "trillion-model"
SHORT_SCENARIO = """\
kind: Scenario
name: smoke
description: One application XID (an alert, nothing taken out), to see the demo through.
duration: 40s
faults:
  - {at: 10s, node: 0, gpu: 0, fault: xid, code: 13, message: Graphics SM Warp Exception}
"""


class SmokeFailure(Exception):
    """One command did not do what it should."""


def http(method: str, url: str, body: bytes | None = None, timeout: float = 10.0,
         media: str = "application/json") -> tuple[int, bytes]:
    """``method url`` with ``body`` of type ``media`` (urllib would say it is a form)."""
    headers = {"Content-Type": media} if body is not None else {}
    request = urllib.request.Request(url, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            return int(reply.status), reply.read()
    except urllib.error.HTTPError as err:
        return int(err.code), err.read()


def wait_for(probe: Callable[[], bool], what: str, timeout: float,
             child: subprocess.Popen[bytes] | None = None, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if child is not None and child.poll() is not None:
            raise SmokeFailure(f"exited {child.returncode} while waiting for {what}:\n"
                               + (log.read_text(errors="replace")[-3000:] if log else ""))
        with contextlib.suppress(OSError, ValueError):
            if probe():
                return
        time.sleep(0.25)
    raise SmokeFailure(f"waited {timeout:g}s for {what}"
                       + (f":\n{log.read_text(errors='replace')[-3000:]}" if log else ""))


class Installed:
    """The installed ``sn-monitor``, run from ``work`` with a clean environment."""

    def __init__(self, venv: Path, work: Path) -> None:
        self.exe = venv / "bin" / "sn-monitor"
        self.python = venv / "bin" / "python"
        if not self.exe.is_file():
            raise SmokeFailure(f"no sn-monitor in {venv}/bin: is the wheel installed there?")
        self.work = work
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("PYTHONPATH", "VIRTUAL_ENV") and not k.startswith("SN_")}
        self.env["PATH"] = f"{venv / 'bin'}{os.pathsep}{self.env.get('PATH', '')}"

    def run(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.exe), *args], cwd=self.work, env=self.env,
                              capture_output=True, text=True, timeout=timeout, check=False)

    def ok(self, *args: str, timeout: float = 60.0) -> str:
        done = self.run(*args, timeout=timeout)
        if done.returncode != 0:
            raise SmokeFailure(f"sn-monitor {' '.join(args)} exited {done.returncode}:\n"
                               f"{done.stdout}{done.stderr}")
        return done.stdout

    @contextlib.contextmanager
    def serve(self, name: str, *args: str) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
        """A long-running command, its output in ``work/NAME.log``; stopped with SIGTERM."""
        log = self.work / f"{name}.log"
        with log.open("wb") as out:
            child = subprocess.Popen([str(self.exe), *args], cwd=self.work, env=self.env,
                                     stdin=subprocess.DEVNULL, stdout=out,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        try:
            yield child, log
        finally:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
                try:
                    child.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(child.pid, signal.SIGKILL)
                    child.wait(timeout=10)


def check_help(sn: Installed) -> None:
    version = sn.ok("version").strip()
    if not version.startswith("sn-monitor "):
        raise SmokeFailure(f"version printed {version!r}")
    sn.ok("--help")
    for command in ("agent", "controller", "demo", "simulate", "goodput", "fleet",
                    "logs", "check-config", "version"):
        sn.ok(command, "--help")


def shipped_files(sn: Installed, deploy: Path) -> list[Path]:
    """deploy/'s config and job files; the rules, scenarios and log signatures in the package."""
    package = Path(subprocess.run(
        [str(sn.python), "-c", "import sn_monitor, pathlib; "
                               "print(pathlib.Path(sn_monitor.__file__).parent)"],
        cwd=sn.work, env=sn.env, capture_output=True, text=True, check=True,
        timeout=60).stdout.strip())
    packaged = sorted((package / "rules").glob("*.yaml")) + sorted(
        (package / "sim" / "scenarios").glob("*.yaml")) + sorted(
        (package / "joblog").glob("*.yaml"))
    if not packaged or not (package / "rules" / "default.yaml").is_file():
        raise SmokeFailure(f"the packaged rules or scenarios are missing under {package}")
    # Every file under deploy/, as a user points check-config there: sn-monitor's own
    # configs are read, other tools' files (manifests, Prometheus, units) told apart.
    return sorted(p for p in deploy.rglob("*") if p.is_file()) + packaged


def uses_kubernetes(path: Path) -> bool:
    """An sn-monitor config (YAML, no apiVersion) that turns on a Kubernetes part."""
    text = path.read_text(encoding="utf-8")
    if path.suffix != ".yaml" or "apiVersion:" in text:
        return False
    return any(line.split("#")[0].strip().startswith(("kubernetes:", "ha: {lease: kubernetes"))
               for line in text.splitlines())


def check_configs(sn: Installed, deploy: Path, kubernetes: bool) -> int:
    files = shipped_files(sn, deploy)
    for path in files:
        done = sn.run("check-config", str(path))
        if "Traceback" in done.stderr:
            raise SmokeFailure(f"check-config {path}: a traceback:\n{done.stderr}")
        if kubernetes or not uses_kubernetes(path):
            if done.returncode != 0:
                raise SmokeFailure(f"check-config {path} exited {done.returncode}:\n"
                                   f"{done.stdout}{done.stderr}")
        elif done.returncode != 0 or "note: the Kubernetes client is not installed" not in \
                done.stdout or EXTRA_HINT not in done.stdout:
            raise SmokeFailure(f"check-config {path} without the kubernetes extra: expected "
                               f"exit 0 with a note naming {EXTRA_HINT}, got "
                               f"{done.returncode}:\n{done.stdout}{done.stderr}")
    return len(files)


def check_controller_and_agent(sn: Installed, deploy: Path) -> None:
    port, agent_port = free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    with sn.serve("controller", "controller", "--listen", f"127.0.0.1:{port}",
                  "--state-dir", str(sn.work / "controller-state")) as (ctl, ctl_log):
        wait_for(lambda: http("GET", f"{url}/readyz")[0] == 200, "the controller's /readyz",
                 60, ctl, ctl_log)
        if "rules from the packaged defaults" not in ctl_log.read_text(errors="replace"):
            raise SmokeFailure("the controller did not say it loaded the packaged rules:\n"
                               + ctl_log.read_text(errors="replace")[-2000:])
        status, body = http("GET", f"{url}/ui/topology")
        if status != 200 or b'data-app="sn-topology"' not in body:
            raise SmokeFailure(f"GET /ui/topology from the package: {status} {body[:200]!r}")
        with sn.serve("agent", "agent", "--simulate", "2", "--node", "smoke-0",
                      "--listen", f"127.0.0.1:{agent_port}", "--controller", url,
                      "--state-dir", str(sn.work / "agent-state")) as (agent, agent_log):
            metrics = f"http://127.0.0.1:{agent_port}/metrics"
            wait_for(lambda: b"sn_gpu_temperature_celsius{" in http("GET", metrics)[1],
                     "the agent's /metrics", 60, agent, agent_log)
            wait_for(lambda: any(n["name"] == "smoke-0" for n in json.loads(
                http("GET", f"{url}/api/v1/nodes")[1])["nodes"]),
                "the agent's report at the controller", 60, agent, agent_log)
        status, body = http("POST", f"{url}/api/v1/jobs",
                            (deploy / "jobs" / "minimal.yaml").read_bytes(),
                            media="application/yaml")
        if status != 201:
            raise SmokeFailure(f"POST /api/v1/jobs with the seed job file: {status} {body!r}")
        status, body = http("GET", f"{url}/api/v1/jobs/{SEED_JOB}")
        if status != 200 or json.loads(body)["state"] != "pending" or json.loads(body)[
                "effective_training_ratio"] is not None:  # no rank has reported yet
            raise SmokeFailure(f"GET /api/v1/jobs/{SEED_JOB}: {status} {body!r}")
        summary = json.loads(sn.ok("simulate", "--controller", url, "--nodes", "4",
                                   "--interval", "0.5", "--duration", "3", "--json",
                                   "--quiet", timeout=120))
        if not summary["accepted"]:
            raise SmokeFailure(f"simulate: nothing accepted: {summary}")
    nobody = sn.run("simulate", "--controller", f"http://127.0.0.1:{free_port()}",
                    "--nodes", "2", "--duration", "2", "--quiet", timeout=120)
    if nobody.returncode != 1:
        raise SmokeFailure(f"simulate against no controller exited {nobody.returncode}, "
                           f"not 1:\n{nobody.stdout}{nobody.stderr}")


def check_kubernetes_driver(sn: Installed, kubernetes: bool) -> None:
    """A controller configured with the Kubernetes driver: runs with the extra, else exit 2."""
    port = free_port()
    config = sn.work / "controller-k8s.yaml"
    config.write_text(f"listen: 127.0.0.1:{port}\nstate_dir: {sn.work / 'k8s-state'}\n"
                      "drivers:\n  kubernetes: {host: 'http://127.0.0.1:9'}\n")
    if not kubernetes:
        done = sn.run("controller", "--config", str(config))
        if done.returncode != 2 or EXTRA_HINT not in done.stderr or "Traceback" in done.stderr:
            raise SmokeFailure(f"controller with drivers.kubernetes and no extra: expected exit "
                               f"2 naming {EXTRA_HINT}, got {done.returncode}:\n{done.stderr}")
        return
    url = f"http://127.0.0.1:{port}"
    with sn.serve("controller-k8s", "controller", "--config", str(config)) as (ctl, log):
        wait_for(lambda: http("GET", f"{url}/readyz")[0] == 200,
                 "the controller with the Kubernetes driver", 60, ctl, log)


def check_demo(sn: Installed) -> None:
    scenario = sn.work / "short.yaml"
    scenario.write_text(SHORT_SCENARIO)
    port = free_port()
    out = sn.ok("demo", "--headless", "--nodes", "3", "--scenario", str(scenario),
                "--speed", "10", "--listen", f"127.0.0.1:{port}",
                "--state-dir", str(sn.work / "demo"), timeout=300)
    summary = json.loads(out)
    if not summary.get("ok"):
        raise SmokeFailure(f"demo --headless: not ok: {json.dumps(summary)[:2000]}")


def check_goodput(sn: Installed) -> None:
    """A day of the packaged catalogue on a small job: every policy, the real controller."""
    out = sn.ok("goodput", "--nodes", "16", "--spares", "2", "--days", "1", "--json",
                timeout=300)
    doc = json.loads(out)
    names = [p["name"] for p in doc["policies"]]
    if names != ["kubernetes", "kubernetes@auto", "torchrun", "torchrun@auto", "sn-monitor",
                 "sn-monitor-advisor"]:
        raise SmokeFailure(f"goodput: policies {names}")
    if "Llama 3" not in doc["trace"]["source"]:
        raise SmokeFailure(f"goodput: not the packaged catalogue: {doc['trace']}")
    trace = sn.work / "trace.csv"  # a day is too short for the catalogue's rate on 16 nodes
    trace.write_text("time,node,kind,code\n1h,node-0003,xid,79\n3h,node-0007,node-lost,\n")
    out = sn.ok("goodput", "--trace", str(trace), "--nodes", "16", "--spares", "2",
                "--policies", "kubernetes,sn-monitor", "--json", timeout=300)
    counts = {p["name"]: p["interruptions"] for p in json.loads(out)["policies"]}
    if counts != {"kubernetes": 2, "sn-monitor": 2}:
        raise SmokeFailure(f"goodput --trace: interruptions {counts}, expected 2 each")


def run(venv: Path, deploy: Path, *, kubernetes: bool, extra_only: bool = False,
        say: Callable[[str], None] = print) -> None:
    """Every check (or those the extra changes), in a temporary directory.

    Raises SmokeFailure.
    """
    with tempfile.TemporaryDirectory(prefix="sn-smoke-") as tmp:
        sn = Installed(venv.resolve(), Path(tmp))
        found = subprocess.run([str(sn.python), "-c", "import kubernetes"], env=sn.env,
                               cwd=sn.work, capture_output=True, timeout=60, check=False)
        if (found.returncode == 0) != kubernetes:
            raise SmokeFailure(f"the kubernetes package is {'missing from' if kubernetes else 'in'}"
                               f" {venv}: not the install this run is for")
        steps: Sequence[tuple[str, bool, Callable[[], object]]] = (
            ("version and --help", True, lambda: check_help(sn)),
            ("check-config on every shipped file", True, lambda: check_configs(
                sn, deploy, kubernetes)),
            ("controller (packaged rules, /readyz), agent (/metrics), the seed job, "
             "simulate", False, lambda: check_controller_and_agent(sn, deploy)),
            ("the Kubernetes driver " + ("runs" if kubernetes else "names the extra"), True,
             lambda: check_kubernetes_driver(sn, kubernetes)),
            ("demo --headless on a short scenario", False, lambda: check_demo(sn)),
            ("goodput on a day of the packaged trace", False, lambda: check_goodput(sn)),
        )
        for what, changed_by_extra, step in steps:
            if extra_only and not changed_by_extra:
                continue
            started = time.monotonic()
            step()
            say(f"ok: {what} ({time.monotonic() - started:.1f}s)")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("venv", type=Path, help="the virtual environment sn-monitor is in")
    parser.add_argument("--kubernetes", action="store_true",
                        help="the kubernetes extra is installed there")
    parser.add_argument("--extra-only", action="store_true",
                        help="only the checks the kubernetes extra changes")
    parser.add_argument("--deploy", type=Path,
                        default=Path(__file__).resolve().parents[2] / "deploy",
                        help="the checkout's deploy/ folder")
    args = parser.parse_args(argv)
    try:
        run(args.venv, args.deploy.resolve(), kubernetes=args.kubernetes,
            extra_only=args.extra_only)
    except (SmokeFailure, subprocess.TimeoutExpired) as err:
        print(f"smoke test failed: {err}", file=sys.stderr)
        return 1
    print("smoke test passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
