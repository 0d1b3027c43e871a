"""A throwaway, real Slurm cluster on loopback for the tests of the Slurm drivers.

``SlurmCluster`` starts, in a fresh temporary directory:

* ``munged`` with its own key file, socket, pid, log and seed files (``--force``: the
  tests run as root, which munged refuses without it);
* ``slurmctld -D`` with a ``slurm.conf`` written there: ``SlurmctldHost=localhost``,
  free ports, ``SlurmUser=root``, state and spool directories in the temporary
  directory, ``auth/munge`` through that socket (``AuthInfo=socket=...``),
  ``proctrack/linuxproc``, ``task/none``, no accounting, a short ``MessageTimeout``;
* one ``slurmd -D -N <name>`` per node name, each on its own port (Debian's slurm-wlm
  is built with ``--enable-multiple-slurmd``: several nodes share one host);
* with ``gpus=N``: ``GresTypes=gpu``, ``Gres=gpu:N`` on each node, and a ``gres.conf``
  with ``AutoDetect=off`` naming N character devices it makes (``mknod``, major 195 as
  the NVIDIA driver's, minors 0..N-1: slurmd refuses plain files), which needs root;
  each node then has N CPUs, so that N one-GPU jobs run on it at once.

Clients find it through ``SLURM_CONF`` (:attr:`SlurmCluster.conf`, :meth:`env`).
``start()`` waits, bounded in time, for ``scontrol ping`` and for every node to be idle;
``stop()`` cancels the jobs, stops the daemons (SIGTERM, then SIGKILL of each process
group) and removes the directory. ``stop_controller()`` / ``start_controller()`` make an
outage of slurmctld, keeping its state.

The programs are found by :func:`find_slurm` on ``PATH`` and in ``/usr/sbin``
(``.ci/run`` installs the Debian packages ``slurmctld slurmd slurm-client munge``).
A run killed before it could stop its cluster leaves it behind: the next ``start()``
kills every such cluster whose starting process is gone (:func:`reap_orphans`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from tests.support.ports import free_port
from tests.support.processes import orphaned

START_TIMEOUT_S = 30
STOP_TIMEOUT_S = 10
NODES = ("n1", "n2", "n3")

_PREFIX = "sn-slurm-"
_OWNER_FILE = "owner.pid"  # the pid of the process that started the cluster
_PROGRAMS = ("munged", "slurmctld", "slurmd", "scontrol", "sbatch", "squeue", "scancel",
             "sinfo", "srun")
_SEARCH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/bin", "/sbin"])


class SlurmError(RuntimeError):
    """The cluster could not be set up, started or stopped (the message has its logs)."""


@dataclass(frozen=True)
class SlurmPrograms:
    """Absolute paths of the Slurm and munge programs."""

    munged: str
    slurmctld: str
    slurmd: str
    scontrol: str
    sbatch: str
    squeue: str
    scancel: str
    sinfo: str
    srun: str


def find_slurm() -> SlurmPrograms | None:
    """The programs, or ``None`` when one is missing (see :func:`missing_programs`)."""
    if missing_programs():
        return None
    found = {name: shutil.which(name, path=_SEARCH) for name in _PROGRAMS}
    return SlurmPrograms(**{name: str(path) for name, path in found.items()})


def missing_programs() -> list[str]:
    """The programs a cluster needs that are not installed."""
    return [name for name in _PROGRAMS if shutil.which(name, path=_SEARCH) is None]


def _kill_pidfiles(directory: Path) -> None:
    for pidfile in directory.glob("*.pid"):
        if pidfile.name == _OWNER_FILE:
            continue
        try:
            pid = int(pidfile.read_text().split()[0])
        except (OSError, IndexError, ValueError):
            continue
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def _kill_jobs(conf: Path) -> None:
    """SIGKILL what is left of the cluster's jobs: processes whose environment names its
    ``SLURM_CONF`` (proctrack/linuxproc can miss a child forked as the job is killed)."""
    marker = f"SLURM_CONF={conf}".encode()
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if marker not in environ.read_bytes().split(b"\0"):
                continue
            pid = int(environ.parent.name)
        except (OSError, ValueError):
            continue
        if pid != os.getpid():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def reap_orphans() -> list[Path]:
    """Kill and remove the clusters left by test runs killed before they could stop them
    (their owner process is gone); returns their directories."""
    reaped = []
    for directory in orphaned(_PREFIX, _OWNER_FILE):
        _kill_pidfiles(directory)
        _kill_jobs(directory / "slurm.conf")
        shutil.rmtree(directory, ignore_errors=True)
        reaped.append(directory)
    return reaped


class SlurmCluster:
    """munged, slurmctld and one slurmd per node name in a temporary directory.

    Also a context manager. See the module docstring.
    """

    def __init__(self, programs: SlurmPrograms | None = None,
                 nodes: tuple[str, ...] = NODES, gpus: int = 0) -> None:
        found = programs or find_slurm()
        if found is None:
            raise SlurmError(f"Slurm is not installed (missing: {', '.join(missing_programs())})")
        self.programs = found
        self.nodes = nodes
        self.gpus = gpus
        self.tmpdir: Path | None = None
        self._processes: dict[str, subprocess.Popen[bytes]] = {}
        self.controller_port = 0

    # ---- paths -------------------------------------------------------------------------

    @property
    def _dir(self) -> Path:
        if self.tmpdir is None:
            raise SlurmError("the cluster has not been started")
        return self.tmpdir

    @property
    def conf(self) -> Path:
        """``slurm.conf``: what ``SLURM_CONF`` names."""
        return self._dir / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        return self._dir / "munge" / "munge.socket"

    def env(self) -> dict[str, str]:
        """The environment for a client: this process's, with ``SLURM_CONF``."""
        return dict(os.environ, SLURM_CONF=str(self.conf))

    def logs(self) -> str:
        """The tails of the daemons' logs, for an error message."""
        parts = []
        for path in sorted(self._dir.glob("*.log")) + sorted(self._dir.glob("munge/*.log")):
            try:
                parts.append(f"--- {path.name} ---\n{path.read_text(errors='replace')[-2000:]}")
            except OSError:
                continue
        return "\n".join(parts)

    # ---- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        """Write the configuration, start munged, slurmctld and the slurmds; wait for all."""
        if self.tmpdir is not None:
            raise SlurmError("already started")
        reap_orphans()
        self.tmpdir = Path(tempfile.mkdtemp(prefix=_PREFIX))
        # munged wants the directory of its socket searchable by everyone.
        self.tmpdir.chmod(0o755)
        (self.tmpdir / _OWNER_FILE).write_text(f"{os.getpid()}\n")
        try:
            self._start_munged()
            self._write_config()
            self.start_controller()
            for node in self.nodes:
                self._spawn(f"slurmd-{node}",
                            [self.programs.slurmd, "-D", "-f", str(self.conf), "-N", node])
            self.wait_nodes_idle(self.nodes)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Cancel every job, stop every daemon and remove the directory. Idempotent."""
        if self.tmpdir is None:
            return
        try:
            if self.controller_running():
                self.run("scancel", "--user", "root", check=False, timeout=STOP_TIMEOUT_S)
                self._wait_queue_empty(STOP_TIMEOUT_S)
        finally:
            # the slurmds first, munged last
            for name in [n for n in self._processes if n.startswith("slurmd")] + [
                    "slurmctld", "munged"]:
                self._terminate(name)
            _kill_pidfiles(self.tmpdir)
            _kill_jobs(self.conf)
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            self.tmpdir = None
            self._processes.clear()

    def start_controller(self) -> None:
        """Start slurmctld (again, with its saved state) and wait until it answers."""
        self._spawn("slurmctld", [self.programs.slurmctld, "-D", "-f", str(self.conf)])
        self._wait("slurmctld answers scontrol ping",
                   lambda: self.run("scontrol", "ping", check=False).returncode == 0)
        if any(name.startswith("slurmd") for name in self._processes):
            # a restarted slurmctld knows its nodes as UNKNOWN until their slurmds register
            self._wait("the slurmds registered again", self._nodes_registered)

    def _nodes_registered(self) -> bool:
        out = self.run("sinfo", "--noheader", "--Node", "--format=%N %T", check=False).stdout
        states = dict(line.split() for line in out.splitlines() if line.strip())
        return all(node in states and not states[node].startswith("unknown")
                   for node in self.nodes)

    def stop_controller(self) -> None:
        """Stop slurmctld (its state stays): clients cannot reach a controller."""
        self._terminate("slurmctld")

    def controller_running(self) -> bool:
        process = self._processes.get("slurmctld")
        return process is not None and process.poll() is None

    def __enter__(self) -> SlurmCluster:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # ---- clients -----------------------------------------------------------------------

    def run(self, program: str, *args: str, check: bool = True,
            timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client program against this cluster."""
        path = getattr(self.programs, program, None) or program
        result = subprocess.run([path, *args], env=self.env(), capture_output=True, text=True,
                                check=False, timeout=timeout, stdin=subprocess.DEVNULL,
                                cwd=self._dir)
        if check and result.returncode != 0:
            raise SlurmError(f"{program} {' '.join(args)} exited {result.returncode}: "
                             f"{(result.stdout + result.stderr).strip()}")
        return result

    def show_node(self, node: str) -> str:
        """``scontrol show node``: what a test checks State= and Reason= in."""
        return self.run("scontrol", "show", "node", node).stdout

    def node_state(self, node: str) -> str:
        """``State=`` of ``scontrol show node`` (``IDLE``, ``IDLE+DRAIN``, ...)."""
        for word in self.show_node(node).split():
            if word.startswith("State="):
                return word.removeprefix("State=")
        raise SlurmError(f"no State= for {node}")

    def resume(self, *nodes: str) -> None:
        """Undrain nodes left drained by a test (any reason); a node not drained is fine."""
        for node in nodes:
            if "DRAIN" in self.node_state(node):
                self.run("scontrol", "update", f"NodeName={node}", "State=RESUME")

    def reset(self) -> None:
        """Between tests: cancel every job, resume every node, wait until all are idle."""
        self.run("scancel", "--user", "root")
        self._wait_queue_empty(STOP_TIMEOUT_S)
        self.resume(*self.nodes)
        self.wait_nodes_idle(self.nodes)

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job``, as key=value pairs (values without spaces only)."""
        out = self.run("scontrol", "show", "job", job_id).stdout
        fields = {}
        for word in out.split():
            key, sep, value = word.partition("=")
            if sep:
                fields.setdefault(key, value)
        return fields

    def sbatch(self, script: str, *args: str) -> str:
        """Submit a batch script (its text); returns the job id."""
        path = self._dir / f"job-{time.monotonic_ns()}.sh"
        path.write_text(script)
        out = self.run("sbatch", "--parsable", f"--output={self._dir}/job-%j.out",
                       "--open-mode=append", *args, str(path)).stdout
        return out.strip().split(";")[0]

    def job_output(self, job_id: str) -> str:
        """What the batch job wrote (``--output``), over all its runs."""
        try:
            return (self._dir / f"job-{job_id}.out").read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def wait_job(self, job_id: str, state: str, timeout: float = START_TIMEOUT_S) -> dict[str, str]:
        """Wait until the job is in ``state``; its fields."""
        fields: dict[str, str] = {}

        def reached() -> bool:
            fields.update(self.job(job_id))
            return fields.get("JobState") == state

        try:
            self._wait(f"job {job_id} {state}", reached, timeout)
        except SlurmError as err:
            seen = self.run("scontrol", "show", "job", job_id, check=False).stdout
            nodes = self.run("sinfo", "--Node", "--long", check=False).stdout
            raise SlurmError(f"{err}\n--- scontrol show job ---\n{seen}\n--- sinfo ---\n"
                             f"{nodes}") from None
        return fields

    def wait_nodes_idle(self, nodes: tuple[str, ...], timeout: float = START_TIMEOUT_S) -> None:
        def idle() -> bool:
            out = self.run("sinfo", "--noheader", "--Node", "--format=%N %T",
                           check=False).stdout
            states = dict(line.split() for line in out.splitlines() if line.strip())
            return all(states.get(node) == "idle" for node in nodes)

        self._wait(f"nodes {','.join(nodes)} idle", idle, timeout)

    # ---- internals ---------------------------------------------------------------------

    def _start_munged(self) -> None:
        munge = self._dir / "munge"
        munge.mkdir(mode=0o700)
        munge.chmod(0o755)
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self._spawn("munged", [
            self.programs.munged, "--foreground", "--force",
            f"--key-file={key}", f"--socket={self.munge_socket}",
            f"--pid-file={munge / 'munged.pid'}", f"--log-file={munge / 'munged.log'}",
            f"--seed-file={munge / 'munged.seed'}"])
        self._wait("munged's socket", self.munge_socket.exists, 10)

    def _write_config(self) -> None:
        d = self._dir
        (d / "state").mkdir()
        (d / "spool").mkdir()
        self.controller_port = free_port()
        lines = [
            "ClusterName=sntest",
            "SlurmctldHost=localhost",
            f"SlurmctldPort={self.controller_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            # cred_expire: how long slurmd remembers a killed job's revoked credential, and
            # so how long a requeued job waits to start again (default 120 s)
            f"AuthInfo=socket={self.munge_socket},cred_expire=5",
            f"StateSaveLocation={d / 'state'}",
            f"SlurmdSpoolDir={d / 'spool'}/%n",
            f"SlurmctldPidFile={d / 'slurmctld.pid'}",
            f"SlurmdPidFile={d / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={d / 'slurmctld.log'}",
            f"SlurmdLogFile={d / 'slurmd-%n.log'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "MpiDefault=none",
            "SwitchType=switch/none",
            # the main scheduler every second (not 60 s): a requeued job starts again soon
            "SchedulerParameters=sched_interval=1",
            "ReturnToService=2",
            # a client gives up on a controller that is not there after a few seconds
            "MessageTimeout=3",
            "SlurmctldTimeout=10",
            "SlurmdTimeout=60",
            "MinJobAge=600",
        ]
        gres = f" Gres=gpu:{self.gpus}" if self.gpus else ""
        if self.gpus:
            lines.append("GresTypes=gpu")
            self._write_gres_conf()
        for node in self.nodes:
            lines.append(f"NodeName={node} NodeHostname=localhost NodeAddr=127.0.0.1 "
                         f"Port={free_port()} CPUs={max(1, self.gpus)}{gres} State=UNKNOWN")
        lines.append(f"PartitionName=test Nodes={','.join(self.nodes)} Default=YES "
                     "MaxTime=INFINITE State=UP")
        self.conf.write_text("\n".join(lines) + "\n")
        (d / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\n")

    def _write_gres_conf(self) -> None:
        """``gres.conf``: ``AutoDetect=off``, each node's GPUs the device files made here."""
        devices = self._dir / "dev"
        devices.mkdir()
        for minor in range(self.gpus):
            try:
                os.mknod(devices / f"nvidia{minor}", 0o666 | stat.S_IFCHR,
                         os.makedev(195, minor))
            except PermissionError as err:
                raise SlurmError(f"cannot make the GPUs' device nodes (needs root): {err}") \
                    from None
        files = f"{devices}/nvidia[0-{self.gpus - 1}]"
        (self._dir / "gres.conf").write_text(
            "AutoDetect=off\n" + "".join(f"NodeName={node} Name=gpu File={files}\n"
                                         for node in self.nodes))

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = (self._dir / f"{name}.out").open("ab")
        try:
            self._processes[name] = subprocess.Popen(
                argv, env=self.env(), stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, cwd=self._dir, start_new_session=True)
        finally:
            log.close()

    def _terminate(self, name: str) -> None:
        process = self._processes.pop(name, None)
        if process is None or process.poll() is not None:
            return
        try:
            os.killpg(process.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                return
            process.wait(STOP_TIMEOUT_S)

    def _wait_queue_empty(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            result = self.run("squeue", "--noheader", "--format=%i", check=False)
            if result.returncode != 0 or not result.stdout.strip():
                return
            time.sleep(0.2)

    def _wait(self, what: str, ready: Callable[[], bool],
              timeout: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while True:
            for name, process in self._processes.items():
                if process.poll() is not None:
                    raise SlurmError(f"{name} exited {process.returncode} while waiting for "
                                     f"{what}\n{self._outputs()}")
            if ready():
                return
            if time.monotonic() > deadline:
                raise SlurmError(f"timed out after {timeout}s waiting for {what}\n"
                                 f"{self._outputs()}")
            time.sleep(0.2)

    def _outputs(self) -> str:
        parts = [self.logs()]
        for path in sorted(self._dir.glob("*.out")):
            parts.append(f"--- {path.name} ---\n{path.read_text(errors='replace')[-2000:]}")
        return "\n".join(parts)
