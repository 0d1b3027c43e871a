"""Shared test settings: where the fixture trees are, which outside tools exist, a
recording HTTP server for the drivers' tests, a real PostgreSQL server, and the
thread-leak guard (tests/threads.py)."""

from __future__ import annotations

import os
import shutil
import socket
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

# The shared helpers' asserts explain a failure as a test's own do: pytest rewrites only
# test and conftest modules unless told, and before the helpers are first imported.
pytest.register_assert_rewrite("tests.support")

from tests.drivers.servers import RecordingHTTPServer  # noqa: E402
from tests.postgres import PostgresServer, find_bindir  # noqa: E402
from tests.slurm import NODES as SLURM_NODES  # noqa: E402
from tests.slurm import SlurmCluster, SlurmError, find_slurm, missing_programs  # noqa: E402
from tests.threads import install as install_thread_guard  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"


def pytest_configure(config: pytest.Config) -> None:
    install_thread_guard(config)


@pytest.fixture
def fixtures() -> Path:
    return FIXTURES


@pytest.fixture
def server() -> Iterator[RecordingHTTPServer]:
    """A :class:`RecordingHTTPServer` on loopback (a module may define its own ``server``)."""
    srv = RecordingHTTPServer()
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture
def listening_port() -> Iterator[int]:
    """A loopback port the test holds, bound and listening, that never answers.

    A server asked to listen there finds it in use; a client connects and waits for an
    answer that never comes.
    """
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def require_tool(name: str) -> str:
    """The path of a Debian tool the test needs; in CI it is installed by .ci/run."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed: run .ci/run (apt-get install prometheus)")
    return path


def assert_promtool_clean(exposition: str) -> None:
    """``promtool check metrics`` finds no problem, not even a warning, in ``exposition``."""
    import subprocess

    promtool = require_tool("promtool")
    result = subprocess.run([promtool, "check", "metrics"], input=exposition, text=True,
                            capture_output=True, check=False, timeout=60)
    problems = (result.stdout + result.stderr).strip()
    assert result.returncode == 0, problems
    assert problems == ""


def expected_messages(directory: Path) -> list[tuple[str, str]]:
    """A corpus of bad files: ``directory/EXPECTED`` lines ``file | message after the path``."""
    rows = []
    for line in (directory / "EXPECTED").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, message = (part.strip() for part in line.split("|", 1))
            rows.append((name, message))
    return rows


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A real PostgreSQL server (tests/postgres.py), started once per session.

    Skipped when PostgreSQL is not installed, unless ``REQUIRE_POSTGRES=1`` (which
    .ci/run sets, after installing the Debian package ``postgresql``): then it fails.
    """
    bindir = find_bindir()
    if bindir is None:
        reason = ("PostgreSQL is not installed (no initdb under /usr/lib/postgresql/*/bin): "
                  "run .ci/run, or apt-get install postgresql")
        if os.environ.get("REQUIRE_POSTGRES") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    srv = PostgresServer(bindir)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """A real Slurm (munged, slurmctld, three slurmds on loopback: tests/slurm.py), started
    once per session (see :func:`start_slurm`)."""
    cluster = start_slurm()
    try:
        yield cluster
    finally:
        cluster.stop()


def start_slurm(nodes: tuple[str, ...] = SLURM_NODES, gpus: int = 0) -> SlurmCluster:
    """A started :class:`SlurmCluster` (``gpus`` GRES per node: device nodes it makes).

    Skipped when Slurm is not installed or cannot start here, unless ``REQUIRE_SLURM=1``
    (which .ci/run sets, after installing ``slurmctld slurmd slurm-client munge``): then
    it fails. The caller stops it.
    """
    programs = find_slurm()
    if programs is None:
        reason = (f"Slurm is not installed (missing: {', '.join(missing_programs())}): run "
                  ".ci/run, or apt-get install slurmctld slurmd slurm-client munge")
        if os.environ.get("REQUIRE_SLURM") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    cluster = SlurmCluster(programs, nodes=nodes, gpus=gpus)
    try:
        cluster.start()
    except SlurmError as err:
        if os.environ.get("REQUIRE_SLURM") == "1":
            raise
        pytest.skip(f"Slurm is installed but cannot start here: {err}")
    return cluster


@dataclass(frozen=True)
class PgDatabase:
    """A fresh empty database on ``server``, owned by the ``sn`` role."""

    server: PostgresServer
    name: str
    dsn: str


@pytest.fixture
def pg_database(postgres_server: PostgresServer) -> Iterator[PgDatabase]:
    """A fresh empty database for one test, dropped afterwards (even if the test stopped
    the server: it is started again first)."""
    name = f"t_{uuid.uuid4().hex[:16]}"
    dsn = postgres_server.create_database(name)
    try:
        yield PgDatabase(postgres_server, name, dsn)
    finally:
        if not postgres_server.running:
            postgres_server.start_server()
        postgres_server.drop_database(name)


@pytest.fixture
def pg_dsn(pg_database: PgDatabase) -> str:
    """The libpq connection string (with the password) of a fresh empty database."""
    return pg_database.dsn
