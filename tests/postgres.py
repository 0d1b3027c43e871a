"""A throwaway, real PostgreSQL server for the tests of the PostgreSQL store.

``PostgresServer`` runs ``initdb`` into a fresh temporary directory and ``pg_ctl`` on it:
listening on 127.0.0.1 on a free port (and on a unix socket in that directory), with the
server's durability settings left at their defaults (``fsync``, ``synchronous_commit`` on).

Two roles exist:

* ``sn_admin``, the superuser, used by this helper only (over the unix socket, trust);
* ``sn``, an ordinary login role with a random password, which owns the test databases.
  TCP connections need the password (scram-sha-256): :meth:`PostgresServer.dsn` carries it,
  so a test can check that it never shows in a log.

``initdb`` refuses to run as root, and tests run as root here and in CI: when the effective
uid is 0 every server program runs as the ``postgres`` system user (the Debian package
creates it) through ``runuser``, in a temporary directory chowned to it.

The binaries are found by :func:`find_bindir`: ``$SN_TEST_PG_BINDIR``, ``pg_config
--bindir``, else the newest ``/usr/lib/postgresql/*/bin`` (``.ci/run`` installs the Debian
package ``postgresql``).

A run killed before it could stop its server leaves it behind: the next ``start()`` stops
and removes every such server whose starting process is gone (:func:`reap_orphans`).
"""

from __future__ import annotations

import os
import pwd
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType

import psycopg
from psycopg import sql

from tests.support.ports import free_port
from tests.support.processes import orphaned

ADMIN_USER = "sn_admin"
USER = "sn"
SYSTEM_USER = "postgres"
START_TIMEOUT_S = 30
STOP_TIMEOUT_S = 30

# Small, but nothing that changes what a commit means: fsync and synchronous_commit stay on.
_SERVER_SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "shared_buffers": "'16MB'",
    "max_connections": "100",
    "log_line_prefix": "'%m [%p] %q%u@%d '",
}

_PREFIX = "sn-pg-"
_OWNER_FILE = "owner.pid"  # the pid of the process that started the server
# the client sessions on a database (%s), other than the asking one
_CLIENTS = "datname = %s AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")


class PostgresError(RuntimeError):
    """The server could not be set up, started or stopped (the message has its output)."""


def _version_key(path: Path) -> tuple[int, ...]:
    # /usr/lib/postgresql/15/bin -> (15,); anything unparsable sorts first
    return tuple(int(part) for part in re.findall(r"\d+", path.parent.name)) or (0,)


def find_bindir() -> Path | None:
    """The directory holding ``initdb`` and ``pg_ctl``, or ``None`` when PostgreSQL is absent."""
    override = os.environ.get("SN_TEST_PG_BINDIR")
    if override:
        return Path(override) if (Path(override) / "initdb").is_file() else None
    pg_config = shutil.which("pg_config")
    if pg_config is not None:
        result = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True,
                                check=False, timeout=30)
        bindir = Path(result.stdout.strip())
        if result.returncode == 0 and (bindir / "initdb").is_file():
            return bindir
    candidates = [p.parent for p in Path("/usr/lib/postgresql").glob("*/bin/initdb")]
    if candidates:
        return max(candidates, key=_version_key)
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def reap_orphans() -> list[Path]:
    """Stop and remove the servers left by test runs that were killed before they could
    stop them (their owner process is gone); returns their directories."""
    reaped = []
    for directory in orphaned(_PREFIX, _OWNER_FILE):
        orphan = PostgresServer()
        orphan.tmpdir = directory
        orphan.stop()
        reaped.append(directory)
    return reaped


def _check_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise ValueError(f"database name {name!r}: lower-case letters, digits, '_' only")
    return name


class PostgresServer:
    """One PostgreSQL cluster in a temporary directory; see the module docstring.

    ``start()`` creates the cluster and starts the server, ``stop()`` stops it (``-m
    immediate`` if a fast stop does not end it) and removes the directory. Between the two,
    ``stop_server()`` / ``start_server()`` / ``restart()`` make an outage while keeping the
    data; ``kill_connections(db)`` drops every session on a database, as a failover would.
    Also a context manager.
    """

    def __init__(self, bindir: Path | None = None) -> None:
        found = bindir or find_bindir()
        if found is None:
            raise PostgresError("no PostgreSQL binaries (initdb, pg_ctl) found")
        self.bindir = found
        self.password = secrets.token_urlsafe(18)
        self.port = 0
        self.tmpdir: Path | None = None
        self.running = False
        self._as_root = os.geteuid() == 0

    # ---- paths -------------------------------------------------------------------------

    @property
    def _dir(self) -> Path:
        if self.tmpdir is None:
            raise PostgresError("the server has not been started")
        return self.tmpdir

    @property
    def datadir(self) -> Path:
        return self._dir / "data"

    @property
    def socket_dir(self) -> Path:
        return self._dir

    @property
    def log_path(self) -> Path:
        """The server's log (``pg_ctl -l``): what a test greps for a leaked password."""
        return self._dir / "server.log"

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    # ---- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        """Create the cluster (``initdb``), start the server and create the ``sn`` role."""
        if self.tmpdir is not None:
            raise PostgresError("already started")
        reap_orphans()
        self.tmpdir = Path(tempfile.mkdtemp(prefix=_PREFIX))
        (self.tmpdir / _OWNER_FILE).write_text(f"{os.getpid()}\n")
        try:
            self._give_to_owner(self.tmpdir)
            self._initdb()
            self._start_on_free_port()
            with self._admin() as conn:
                conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                    sql.Identifier(USER), sql.Literal(self.password)))
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop the server (whatever it takes) and remove its directory. Idempotent."""
        if self.tmpdir is None:
            return
        try:
            if self.running or (self.datadir / "postmaster.pid").exists():
                self.stop_server()
        finally:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            self.tmpdir = None
            self.running = False

    def start_server(self) -> None:
        """Start the (stopped) server again on the same port, with the same data."""
        self._pg_ctl("start", "-l", str(self.log_path), "-o", f"-p {self.port}",
                     "-w", "-t", str(START_TIMEOUT_S))
        self.running = True

    def stop_server(self, mode: str = "fast") -> None:
        """Stop the server, keeping its data: ``fast`` (clean) or ``immediate`` (a crash:
        the next start replays the WAL). Falls back to ``immediate``, then to SIGKILL."""
        if mode not in ("fast", "immediate"):
            raise ValueError(f"mode {mode!r}: 'fast' or 'immediate'")
        try:
            self._pg_ctl("stop", "-m", mode, "-w", "-t", str(STOP_TIMEOUT_S))
        except (PostgresError, subprocess.TimeoutExpired):
            try:
                self._pg_ctl("stop", "-m", "immediate", "-w", "-t", str(STOP_TIMEOUT_S))
            except (PostgresError, subprocess.TimeoutExpired):
                self._kill_postmaster()
        finally:
            self.running = False

    def restart(self, mode: str = "fast") -> None:
        """``stop_server(mode)`` then ``start_server()``: every connection is lost."""
        self.stop_server(mode)
        self.start_server()

    def __enter__(self) -> PostgresServer:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # ---- databases ---------------------------------------------------------------------

    def dsn(self, dbname: str) -> str:
        """A libpq connection string for ``dbname`` as the ``sn`` role, over TCP."""
        return (f"host=127.0.0.1 port={self.port} user={USER} password={self.password} "
                f"dbname={_check_name(dbname)}")

    def create_database(self, name: str) -> str:
        """Create an empty database owned by ``sn``; returns its :meth:`dsn`."""
        with self._admin() as conn:
            conn.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(
                sql.Identifier(_check_name(name)), sql.Identifier(USER)))
        return self.dsn(name)

    def drop_database(self, name: str) -> None:
        """Drop ``name`` (if it exists), ending the sessions still on it."""
        with self._admin() as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(_check_name(name))))

    def kill_connections(self, dbname: str, timeout_s: float = 10.0) -> int:
        """Terminate every session on ``dbname`` and wait until they are gone; returns how
        many there were. A client's next query fails with ``psycopg.OperationalError``.
        Only client sessions: an autovacuum worker may come back at any time."""
        with self._admin() as conn:
            rows = conn.execute(
                f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE {_CLIENTS}",
                (dbname,)).fetchall()
            deadline = time.monotonic() + timeout_s
            while True:
                row = conn.execute(
                    f"SELECT count(*) FROM pg_stat_activity WHERE {_CLIENTS}",
                    (dbname,)).fetchone()
                if row is None or row[0] == 0:
                    return len(rows)
                if time.monotonic() > deadline:
                    raise PostgresError(f"{row[0]} sessions on {dbname} outlived termination")
                time.sleep(0.02)

    @contextmanager
    def _admin(self) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
        """A superuser connection over the unix socket (local trust), autocommit."""
        with psycopg.connect(host=str(self.socket_dir), port=self.port, user=ADMIN_USER,
                             dbname="postgres", autocommit=True, connect_timeout=10) as conn:
            yield conn

    # ---- programs ----------------------------------------------------------------------

    def _owner_ids(self) -> tuple[int, int]:
        try:
            entry = pwd.getpwnam(SYSTEM_USER)
        except KeyError:
            raise PostgresError(
                f"running as root, and there is no {SYSTEM_USER!r} user to run PostgreSQL as "
                "(initdb refuses root; the Debian package creates the user)") from None
        return entry.pw_uid, entry.pw_gid

    def _give_to_owner(self, path: Path) -> None:
        if self._as_root:
            uid, gid = self._owner_ids()
            os.chown(path, uid, gid)

    def _command(self, program: str, *args: str) -> list[str]:
        argv = [str(self.bindir / program), *args]
        if self._as_root:
            return ["runuser", "-u", SYSTEM_USER, "--", *argv]
        return argv

    def _run(self, program: str, *args: str, timeout: float) -> str:
        argv = self._command(program, *args)
        # cwd: the postgres user may not be allowed into the caller's working directory.
        result = subprocess.run(argv, cwd=self._dir, capture_output=True, text=True,
                                check=False, timeout=timeout, stdin=subprocess.DEVNULL)
        output = (result.stdout + result.stderr).strip()
        if result.returncode != 0:
            raise PostgresError(f"{program} {' '.join(args)} exited {result.returncode}:\n"
                                f"{output}\n--- server log ---\n{self.log_text()[-4000:]}")
        return output

    def _pg_ctl(self, *args: str) -> str:
        return self._run("pg_ctl", "-D", str(self.datadir), *args,
                         timeout=max(START_TIMEOUT_S, STOP_TIMEOUT_S) + 15)

    def _initdb(self) -> None:
        pwfile = self._dir / "pwfile"
        pwfile.write_text(secrets.token_urlsafe(18) + "\n")  # the superuser's; never used
        pwfile.chmod(0o600)
        self._give_to_owner(pwfile)
        try:
            # --no-sync: initdb skips its final flush of the new files to disk; the server
            # itself runs with fsync on (a crash of the machine loses the test run anyway).
            self._run("initdb", "-D", str(self.datadir), "-U", ADMIN_USER,
                      f"--pwfile={pwfile}", "--auth-local=trust",
                      "--auth-host=scram-sha-256", "--encoding=UTF8", "--locale=C",
                      "--no-sync", timeout=120)
        finally:
            pwfile.unlink(missing_ok=True)
        settings = dict(_SERVER_SETTINGS, unix_socket_directories=f"'{self.socket_dir}'")
        with (self.datadir / "postgresql.conf").open("a") as conf:
            conf.write("\n# tests/postgres.py\n")
            conf.writelines(f"{key} = {value}\n" for key, value in settings.items())

    def _start_on_free_port(self, attempts: int = 3) -> None:
        for attempt in range(attempts):
            self.port = free_port()
            try:
                self.start_server()
                return
            except PostgresError:
                # Another process may have taken the port between the probe and the bind.
                if attempt == attempts - 1 or "could not bind" not in self.log_text():
                    raise
                self.stop_server("immediate")
                self.log_path.unlink(missing_ok=True)

    def _kill_postmaster(self) -> None:
        pidfile = self.datadir / "postmaster.pid"
        try:
            pid = int(pidfile.read_text().split()[0])
        except (OSError, IndexError, ValueError):
            return
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            return
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)
