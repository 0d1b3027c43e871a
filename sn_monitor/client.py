"""What a training script imports: report progress and checkpoints, learn when to checkpoint.

Depends only on :mod:`requests` and the standard library (nothing else from sn_monitor), so
importing it into a training job is cheap::

    from sn_monitor.client import JobClient

    client = JobClient.from_env()          # SN_CONTROLLER_URL, SN_JOB, RANK, WORLD_SIZE ...
    start = 0
    point = client.restore_point()         # synchronous, once, at start-up
    if point is not None:
        load(point.path)
        start = point.step
    for step in range(start + 1, total + 1):
        train_one_step()
        client.progress(step)              # an append under a lock: no I/O
        if step % every == 0 or client.should_checkpoint():
            path = save(step)
            if client.rank == 0:
                client.checkpoint_saved(step, path)
    client.close()                         # also runs at exit

Environment read by :meth:`JobClient.from_env`:

``SN_CONTROLLER_URL`` (required)
    e.g. ``http://sn-controller:9848``; a pair of controllers (high availability) as a
    comma-separated list: requests go to the one that last answered, and on a failure
    (unreachable, 5xx, a standby's 503) at once to the next; only when every one failed
    does the client back off.
``SN_JOB`` (required)
    the job's name, as in the DistributedJob's ``metadata.name``.
``SN_TOKEN_FILE``
    a file holding the controller's bearer token (the token is never logged).
``SN_CA_FILE``
    with an ``https://`` URL: the CA bundle the controller's certificate must chain to
    (default: the system's trusted CAs).
``SN_NODE``
    this node's name as its agent reports it; default: the hostname.
``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``
    set by torchrun; ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID`` are the
    fallbacks under ``srun``; default: a single process (rank 0 of 1).
``SN_FLUSH_INTERVAL``
    seconds between flushes to the controller (default 1).

Wire contract (JSON, ``Authorization: Bearer <token>`` when there is one):

- ``POST {url}/api/v1/jobs/{job}/progress`` with ``{"rank", "node", "world_size",
  "updates": [{"step", "time"}, ...], "step_time_seconds"}``: the latest few steps
  (at most :data:`MAX_UPDATES_PER_POST`) with their wall times, and the median seconds
  per step over the recent steps (null until two steps are known). The reply is
  ``{"checkpoint_requested": bool, "checkpoint_id": str|null, "restore": null |
  {"step", "path", "nodes": [...], "generation"}}``.
- ``POST {url}/api/v1/jobs/{job}/checkpoints`` with ``{"rank", "node", "step", "path"}``
  once a checkpoint is complete on storage. Normally only rank 0 calls
  :meth:`JobClient.checkpoint_saved` (one report per checkpoint, not one per rank).
- ``GET {url}/api/v1/jobs/{job}/restore-point`` → ``{"step", "path", "generation"}``, or
  404 / ``null`` when there is none.

Behaviour towards the training loop: :meth:`~JobClient.progress`,
:meth:`~JobClient.checkpoint_saved` and :meth:`~JobClient.should_checkpoint` only take a
lock and touch memory; a daemon thread does all network I/O, batching updates every
``flush_interval`` seconds. A controller outage never raises into the caller: it is logged
once (and its end once), and the thread retries with exponential backoff (from
``flush_interval`` up to :data:`MAX_BACKOFF_SECONDS`, with jitter). Progress updates are
held in a bounded queue that drops the oldest (only the latest steps matter); checkpoint
reports are never dropped for space, and are retried until the controller takes them.
A checkpoint report or progress batch the controller refuses with a 4xx (other than 408
and 429) would be refused again, so it is dropped with an error log line instead.
"""

from __future__ import annotations

import atexit
import collections
import enum
import itertools
import logging
import math
import os
import random
import socket
import statistics
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import requests

log = logging.getLogger(__name__)

API_PREFIX = "/api/v1/jobs/"
#: Progress updates sent in one POST (the latest ones); older unsent ones are dropped.
MAX_UPDATES_PER_POST = 8
#: Recent steps kept for the step-time estimate.
STEP_TIME_WINDOW = 32
MAX_BACKOFF_SECONDS = 30.0
_JITTER = 0.2
_MAX_LOGGED_MESSAGES = 64
_MAX_REMEMBERED_CHECKPOINT_IDS = 64
_MAX_ERROR_TEXT = 300


@dataclass(frozen=True)
class RestorePoint:
    """Where to resume: the checkpoint of ``step`` at ``path``, restore ``generation``.

    An empty ``path`` means the controller restarts the job from scratch (no complete
    checkpoint exists).
    """

    step: int
    path: str
    generation: int = 0
    #: The nodes the restored job runs on (only in a progress reply's ``restore``).
    nodes: tuple[str, ...] = ()


@dataclass(frozen=True)
class ProgressReply:
    """The controller's latest answer to a progress POST."""

    checkpoint_requested: bool = False
    checkpoint_id: str | None = None
    #: Set while the controller is restoring the job (a new generation is starting).
    restore: RestorePoint | None = None


class _Outcome(enum.Enum):
    OK = "ok"
    RETRY = "retry"  # controller unreachable, 5xx, 408, 429: keep and back off
    REFUSED = "refused"  # any other 4xx: the same body would be refused again


@dataclass(frozen=True)
class _CheckpointReport:
    step: int
    path: str
    save_seconds: float | None = None


class _Failover:
    """The controllers in order, the one requests go to, and when the next try may go.

    A failure moves to the next controller at once while one is left untried since the
    last success (a standby's 503 or a dead active costs one request, not a backoff
    period); once every one failed in a row, the tries back off exponentially, from
    ``first_delay`` up to ``max_delay``, with jitter. Owned by whoever holds the client's
    I/O lock.
    """

    def __init__(self, urls: list[str], first_delay: float, max_delay: float,
                 clock: Callable[[], float], rng: random.Random) -> None:
        self.urls = urls
        self._current = 0
        self._failed_in_row = 0
        self._first_delay = first_delay
        self._max_delay = max(max_delay, first_delay)
        self._clock = clock
        self._rng = rng
        self._delay = 0.0
        self._next_attempt = -math.inf
        self._down = False

    @property
    def url(self) -> str:
        """The controller requests go to now."""
        return self.urls[self._current]

    @property
    def delay(self) -> float:
        """The backoff delay now (before jitter); 0 while the controller in use answers."""
        return self._delay

    def waiting(self) -> bool:
        """Whether a try now would come before the backoff delay is over."""
        return self._clock() < self._next_attempt

    def back_off(self) -> None:
        """Wait before the next try: twice as long as the last time (with jitter)."""
        self._delay = (min(self._delay * 2, self._max_delay) if self._delay
                       else self._first_delay)
        jitter = 1 + self._rng.uniform(-_JITTER, _JITTER)
        self._next_attempt = self._clock() + self._delay * jitter

    def unreachable(self, err: object) -> None:
        """The controller in use failed: the next one now, or back off (logged once)."""
        if self._fail_over(err):
            return
        self.back_off()
        if not self._down:
            self._down = True
            log.warning("sn-monitor controller %s unreachable (%s); training goes on, "
                        "progress and checkpoint reports are retried with backoff",
                        ", ".join(self.urls), _short(err))

    def _fail_over(self, err: object) -> bool:
        """Move to the next controller; True if it is untried since the last success."""
        if len(self.urls) == 1:
            return False
        failed = self.url
        self._current = (self._current + 1) % len(self.urls)
        self._failed_in_row += 1
        if self._failed_in_row % len(self.urls) == 0:
            return False  # every controller failed in this round: back off
        log.info("sn-monitor controller %s failed (%s); trying %s", failed, _short(err),
                 self.url)
        self._next_attempt = -math.inf
        return True

    def reachable(self) -> None:
        """The controller in use answered: no backoff; its return logged once."""
        self._failed_in_row = 0
        self._delay = 0.0
        self._next_attempt = -math.inf
        if self._down:
            self._down = False
            log.info("sn-monitor controller %s reachable again", self.url)


class _CheckpointRequests:
    """The controller's requests for a checkpoint, each answered once.

    One per ``checkpoint_id``; a request without an id, once per run of replies asking.
    Guarded by the client's lock.
    """

    def __init__(self) -> None:
        self._consumed_ids: collections.deque[str] = collections.deque(
            maxlen=_MAX_REMEMBERED_CHECKPOINT_IDS)
        self._last_requested = False
        self._pending = False

    def observe(self, requested: bool, checkpoint_id: str | None) -> None:
        """A progress reply asked for a checkpoint (``requested``), or no longer does."""
        if requested:
            if checkpoint_id is None:
                if not self._last_requested:  # no id: once per request episode
                    self._pending = True
            elif checkpoint_id not in self._consumed_ids:
                self._consumed_ids.append(checkpoint_id)
                self._pending = True
        self._last_requested = requested

    def take(self) -> bool:
        """True once after a new request; reading clears it."""
        pending = self._pending
        self._pending = False
        return pending


class JobClient:
    """A training process's link to the sn-monitor controller; see the module docstring.

    Thread-safe. ``clock`` (monotonic seconds) times step durations and backoff; the
    ``time`` of each update is wall-clock time (:func:`time.time`). ``verify``, for an
    ``https://`` URL: a CA bundle path, or False to skip the check (tests only); None
    leaves the session's own setting (the system's CAs).
    """

    def __init__(
        self,
        url: str,
        job: str,
        rank: int,
        world_size: int,
        node: str,
        token: str | None = None,
        flush_interval: float = 1.0,
        timeout: float = 2.0,
        session: requests.Session | None = None,
        clock: Callable[[], float] = time.monotonic,
        *,
        local_rank: int = 0,
        max_backoff: float = MAX_BACKOFF_SECONDS,
        rng: random.Random | None = None,
        verify: bool | str | None = None,
    ) -> None:
        urls = [u.strip().rstrip("/") for u in url.split(",") if u.strip()]
        if not urls:
            raise ValueError("controller url is empty")
        if not job:
            raise ValueError("job name is empty")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not within world size {world_size}")
        if not (flush_interval > 0 and math.isfinite(flush_interval)):
            raise ValueError("flush_interval must be a positive number of seconds")
        if not timeout > 0:
            raise ValueError("timeout must be positive")
        #: The controllers, in order; ``url`` is the one in use.
        self.urls = urls
        self.job = job
        self.rank = rank
        self.world_size = world_size
        self.local_rank = local_rank
        self.node = node
        self.flush_interval = float(flush_interval)
        self.timeout = float(timeout)
        self._token = token
        self._owns_session = session is None
        self._session = session if session is not None else requests.Session()
        # Per request, not on the session: requests lets REQUESTS_CA_BUNDLE override a
        # session's ``verify``.
        self._verify = verify
        self._clock = clock
        self._job_path = API_PREFIX + quote(job, safe="")

        # Guards everything below that the training loop touches.
        self._lock = threading.Lock()
        self._pending: collections.deque[tuple[int, float]] = collections.deque(
            maxlen=MAX_UPDATES_PER_POST)
        self._recent: collections.deque[tuple[int, float]] = collections.deque(
            maxlen=STEP_TIME_WINDOW)
        self._checkpoints: collections.deque[_CheckpointReport] = collections.deque()
        self._reply: ProgressReply | None = None
        self._requests = _CheckpointRequests()
        self._closed = False
        self._thread: threading.Thread | None = None

        # Owned by whoever holds _io_lock (the flush thread, or restore_point at start-up).
        self._io_lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._failover = _Failover(urls, self.flush_interval, float(max_backoff), clock,
                                   rng or random.Random())
        self._logged: set[str] = set()
        self._thread_error_logged = False
        #: Requests that failed or were refused, and requests the controller took.
        self.failures_total = 0
        self.requests_total = 0

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, **kwargs: Any,
    ) -> JobClient:
        """A client configured from the environment (see the module docstring).

        ``kwargs`` go to the constructor (``session``, ``clock``, ``timeout`` ...).
        :class:`ValueError` names a missing or malformed variable; the token file's
        content never appears in it.
        """
        env = os.environ if environ is None else environ
        url = env.get("SN_CONTROLLER_URL", "").strip()
        if not url:
            raise ValueError("SN_CONTROLLER_URL is not set")
        job = env.get("SN_JOB", "").strip()
        if not job:
            raise ValueError("SN_JOB is not set")
        token = None
        token_file = env.get("SN_TOKEN_FILE", "").strip()
        if token_file:
            token = read_token(token_file)
        ca_file = env.get("SN_CA_FILE", "").strip()
        if ca_file and "verify" not in kwargs:
            if not os.path.isfile(ca_file):
                raise ValueError(f"SN_CA_FILE={ca_file!r} is not a file")
            kwargs["verify"] = ca_file
        node = env.get("SN_NODE", "").strip() or socket.gethostname()
        rank = _env_int(env, ("RANK", "SLURM_PROCID"), 0)
        world_size = _env_int(env, ("WORLD_SIZE", "SLURM_NTASKS"), 1)
        local_rank = _env_int(env, ("LOCAL_RANK", "SLURM_LOCALID"), 0)
        if "flush_interval" not in kwargs and env.get("SN_FLUSH_INTERVAL", "").strip():
            raw = env["SN_FLUSH_INTERVAL"].strip()
            try:
                kwargs["flush_interval"] = float(raw)
            except ValueError:
                raise ValueError(f"SN_FLUSH_INTERVAL={raw!r} is not a number") from None
        kwargs.setdefault("local_rank", local_rank)
        return cls(url, job, rank, world_size, node, token, **kwargs)

    @property
    def url(self) -> str:
        """The controller requests go to now."""
        return self._failover.url

    def _endpoint(self, what: str) -> str:
        return f"{self.url}{self._job_path}/{what}"

    def __repr__(self) -> str:  # no token here
        return (f"JobClient(url={self.url!r}, job={self.job!r}, rank={self.rank}, "
                f"world_size={self.world_size}, node={self.node!r})")

    # ------------------------------------------------------------- training-loop side

    def progress(self, step: int) -> None:
        """Record that ``step`` is done; sent by the background thread. No I/O here."""
        wall = time.time()
        now = self._clock()
        with self._lock:
            if self._closed:
                return
            if self._recent and step <= self._recent[-1][0]:
                self._recent.clear()  # went back (restored): old durations no longer apply
            self._recent.append((step, now))
            self._pending.append((step, wall))
        if self._thread is None:
            self._start()

    def checkpoint_saved(self, step: int, path: str | os.PathLike[str],
                         save_seconds: float | None = None) -> None:
        """Report that the checkpoint of ``step`` at ``path`` is complete on storage.

        Queued, sent by the background thread, never dropped for space. Call it once per
        checkpoint, after the last byte is written, normally from rank 0 only.
        ``save_seconds``: how long training stood still for it (with an asynchronous
        save, the staging, not the upload): the controller recommends the checkpoint
        interval from it (``checkpointInterval: auto``).
        """
        with self._lock:
            if self._closed:
                log.warning("checkpoint of step %d reported after close(): not sent", step)
                return
            self._checkpoints.append(_CheckpointReport(int(step), os.fspath(path),
                                                       save_seconds))
        if self._thread is None:
            self._start()
        self._wake.set()  # a checkpoint report is worth sending now

    def should_checkpoint(self) -> bool:
        """True once after the controller asked for a checkpoint; reading clears it.

        The controller asks (scheduled, or pre-emptively because a node is degrading) in
        its replies to progress; each ``checkpoint_id`` makes this true once only.
        """
        with self._lock:
            return self._requests.take()

    @property
    def last_reply(self) -> ProgressReply | None:
        """The controller's latest reply to progress (None before the first)."""
        with self._lock:
            return self._reply

    # --------------------------------------------------------------------- start-up

    def restore_point(self) -> RestorePoint | None:
        """Where to resume from, asked synchronously (at most about ``timeout`` seconds).

        None when there is no restore point (404 or ``null``), when the controller cannot
        be reached, or when its answer is malformed (logged).
        """
        with self._io_lock:
            for _ in self.urls:  # each controller once: a standby or a dead one, the next
                try:
                    resp = self._session.get(self._endpoint("restore-point"),
                                             headers=self._headers(), timeout=self.timeout,
                                             verify=self._verify)
                except requests.RequestException as err:
                    self._note_unreachable(err)
                    continue
                if resp.status_code < 500:
                    break
                self._note_unreachable(f"HTTP {resp.status_code}")
            else:
                return None
        self.requests_total += 1
        if resp.status_code in (204, 404):
            self._failover.reachable()
            return None
        if not resp.ok:
            self.failures_total += 1
            self._note_http_error("restore-point", resp)
            return None
        self._failover.reachable()
        try:
            data = resp.json()
        except ValueError:
            self._log_once("restore-point reply is not JSON")
            return None
        if data is None:
            return None
        point = _parse_restore(data)
        if point is None:
            self._log_once(f"restore-point reply is malformed: {_short(data)}")
        return point

    # ------------------------------------------------------------------------ close

    def close(self) -> None:
        """Send what is queued (one last try) and stop the thread. Idempotent.

        Waits at most a few request timeouts; a controller that is down is not waited for
        beyond that (unsent checkpoint reports are logged).
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
        atexit.unregister(self.close)
        if thread is not None:
            self._stop.set()
            self._wake.set()
            thread.join(timeout=3 * self.timeout + 1)
        with self._lock:
            left = len(self._checkpoints)
        if left and (thread is None or not thread.is_alive()):
            log.error("controller %s did not get %d checkpoint report(s)", self.url, left)
        if self._owns_session and (thread is None or not thread.is_alive()):
            self._session.close()

    def __enter__(self) -> JobClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------- background thread

    def _start(self) -> None:
        with self._lock:
            if self._thread is not None or self._closed:
                return
            self._thread = threading.Thread(target=self._run, name="sn-monitor-client",
                                            daemon=True)
            self._thread.start()
        atexit.register(self.close)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.flush_interval)
            self._wake.clear()
            if self._stop.is_set():
                break
            self._guarded_flush(force=False)
        self._guarded_flush(force=True)  # the last try on close

    def _guarded_flush(self, force: bool) -> None:
        try:
            self._flush(force)
        except Exception:  # the thread must outlive any bug in a reply
            if not self._thread_error_logged:
                self._thread_error_logged = True
                log.exception("unexpected error in the sn-monitor client thread")

    def _flush(self, force: bool) -> None:
        if not force and self._failover.waiting():
            return  # backing off
        with self._io_lock:
            if self._send_checkpoints():
                self._send_progress()

    def _send_checkpoints(self) -> bool:
        """Send queued checkpoint reports in order; False if the controller is down."""
        while True:
            with self._lock:
                if not self._checkpoints:
                    return True
                report = self._checkpoints[0]
            body: dict[str, Any] = {"rank": self.rank, "node": self.node,
                                    "step": report.step, "path": report.path}
            if report.save_seconds is not None:
                body["save_seconds"] = report.save_seconds
            outcome, _ = self._post(self._endpoint("checkpoints"), body, "checkpoints")
            if outcome is _Outcome.RETRY:
                return False
            with self._lock:
                self._checkpoints.popleft()
            if outcome is _Outcome.REFUSED:
                log.error("controller refused the checkpoint report of step %d (%s)",
                          report.step, report.path)

    def _send_progress(self) -> None:
        with self._lock:
            if not self._pending:
                return
            batch = list(self._pending)
            self._pending.clear()
            recent = list(self._recent)
        body = {
            "rank": self.rank,
            "node": self.node,
            "world_size": self.world_size,
            "updates": [{"step": step, "time": wall} for step, wall in batch],
            "step_time_seconds": _step_time(recent),
        }
        outcome, reply = self._post(self._endpoint("progress"), body, "progress")
        if outcome is _Outcome.RETRY:
            with self._lock:  # put them back before anything newer; maxlen keeps the latest
                newer = list(self._pending)
                self._pending.clear()
                self._pending.extend(batch + newer)
            return
        if outcome is _Outcome.OK and reply is not None:
            self._apply_reply(reply)

    def _post(self, url: str, body: dict[str, Any], what: str) -> tuple[_Outcome, Any]:
        try:
            resp = self._session.post(url, json=body, headers=self._headers(),
                                      timeout=self.timeout, verify=self._verify,
                                      allow_redirects=False)
        except requests.RequestException as err:
            self._note_unreachable(err)
            return _Outcome.RETRY, None
        if resp.status_code >= 500 or resp.status_code in (408, 429):
            self._note_unreachable(f"HTTP {resp.status_code}")
            return _Outcome.RETRY, None
        if not resp.ok:
            self._note_http_error(what, resp)
            self.failures_total += 1
            self._failover.back_off()  # it will be refused again; do not hammer
            return _Outcome.REFUSED, None
        self.requests_total += 1
        self._failover.reachable()
        try:
            return _Outcome.OK, resp.json() if resp.content else None
        except ValueError:
            self._log_once(f"controller reply to {what} is not JSON")
            return _Outcome.OK, None

    def _apply_reply(self, data: Any) -> None:
        reply = _parse_progress_reply(data)
        if reply is None:
            self._log_once(f"controller reply to progress is malformed: {_short(data)}")
            return
        with self._lock:
            self._reply = reply
            self._requests.observe(reply.checkpoint_requested, reply.checkpoint_id)

    # ---------------------------------------------------------------- state, logging

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._token}"} if self._token else {}

    def _note_unreachable(self, err: object) -> None:
        self.failures_total += 1
        self._failover.unreachable(err)

    def _note_http_error(self, what: str, resp: requests.Response) -> None:
        self._log_once(f"controller refused {what}: HTTP {resp.status_code} "
                       f"{_short(resp.text)}")

    def _log_once(self, message: str) -> None:
        if message in self._logged or len(self._logged) >= _MAX_LOGGED_MESSAGES:
            return
        self._logged.add(message)
        log.error("%s", message)


# ------------------------------------------------------------------------- helpers


def read_token(path: str | os.PathLike[str]) -> str:
    """The bearer token in ``path``, stripped; the error names the file, never the token."""
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
    except OSError as err:
        raise ValueError(f"cannot read token file {path}: {err.strerror or err}") from None
    except UnicodeDecodeError:
        raise ValueError(f"token file {path} is not UTF-8 text") from None
    if not token or any(c.isspace() for c in token):
        raise ValueError(f"token file {path} must hold exactly one word")
    return token


def _env_int(env: Mapping[str, str], names: tuple[str, ...], default: int) -> int:
    for name in names:
        raw = env.get(name, "").strip()
        if raw:
            try:
                value = int(raw)
            except ValueError:
                raise ValueError(f"{name}={raw!r} is not an integer") from None
            if value < 0:
                raise ValueError(f"{name}={raw!r} is negative")
            return value
    return default


def _parse_restore(data: Any) -> RestorePoint | None:
    if not isinstance(data, dict):
        return None
    step, path, generation = data.get("step"), data.get("path"), data.get("generation", 0)
    nodes = data.get("nodes") or []
    if (not isinstance(step, int) or isinstance(step, bool) or step < 0
            or not isinstance(generation, int) or isinstance(generation, bool)
            or not isinstance(path, str)
            or not isinstance(nodes, list) or not all(isinstance(n, str) for n in nodes)):
        return None
    return RestorePoint(step, path, generation, tuple(nodes))


def _parse_progress_reply(data: Any) -> ProgressReply | None:
    """A progress reply, or None when it is not a JSON object."""
    if not isinstance(data, dict):
        return None
    raw_id = data.get("checkpoint_id")
    raw_restore = data.get("restore")
    return ProgressReply(
        checkpoint_requested=data.get("checkpoint_requested") is True,
        checkpoint_id=raw_id if isinstance(raw_id, str) else None,
        restore=_parse_restore(raw_restore) if raw_restore is not None else None)


def _step_time(recent: list[tuple[int, float]]) -> float | None:
    """Median seconds per step over consecutive recorded steps (None if under two)."""
    durations = [
        (t1 - t0) / (s1 - s0)
        for (s0, t0), (s1, t1) in itertools.pairwise(recent)
        if s1 > s0
    ]
    return statistics.median(durations) if durations else None


def _short(value: object) -> str:
    text = str(value)
    return text if len(text) <= _MAX_ERROR_TEXT else text[:_MAX_ERROR_TEXT] + "..."
