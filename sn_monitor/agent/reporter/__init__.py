"""Sends a report to the controller after each sample and hands back its commands.

``POST {url}/api/v1/reports`` with a JSON :class:`Report`, ``Authorization: Bearer``, over
one keep-alive :class:`requests.Session` (over HTTPS: ``verify`` is the CA bundle the
controller's certificate must chain to, ``cert`` the agent's client certificate and key).
Events ride along from the :class:`EventSpool` and leave it only when a reply says the
controller stored them (``events_stored_through``), so an outage or a restart loses
none; metrics are never resent, the controller sees fresh samples when it is back.

When the controller is unreachable (connection refused, timeout, 5xx, 429) the reporter
backs off: exponentially from one interval up to :data:`MAX_BACKOFF_SECONDS`, with
jitter so a supernode's agents do not return in lockstep. While backing off
:meth:`Reporter.report` makes no network call and returns no commands; sampling, the
guard and /metrics go on. Any other 4xx (a report the controller refuses, a bad token)
is also a failure; its message is logged once per distinct message, because the same
report will be refused again every second.

Several controllers (a high-availability pair on bare metal, where no Service picks the
active one) are tried in order, sticky: reports go to the controller that last accepted
one. When it cannot be reached (connection refused, timeout, TLS) or answers as a
standby (503 with ``X-SN-Controller-Role: standby``), the same report goes to the next
controller at once, without backing off and whatever the standby's ``Retry-After``; only
when every controller failed in one such round does the backoff above apply, and the
next round starts from the same controller again. Any other failure (a 5xx or 429 from
the active controller, a refusal, a redirect) backs off on that controller as with one.

The reply is decoded leniently: a command this agent does not understand (a newer
controller) is answered with a failed result instead of making the whole reply, and
with it the event acknowledgement, undecodable.

**The reports' stream** (:mod:`sn_monitor.report_stream`, :mod:`sn_monitor.agent.stream`).
Reports go on a stream to the controller when it has them: one connection, one frame per
report, and an answer only to a report that asks (one carrying events or command
results, the first on a new stream, and one every
:data:`~sn_monitor.report_stream.ASK_EVERY_SECONDS`, which tells a controller that has
stopped answering) or whose answer carries commands or rules. Answers that came on their
own (commands) are read before the next report, without waiting. A controller that
answers the opening 404
(an earlier version), or whose TLS the stream cannot set up, gets posted reports, and
the stream is tried again after :data:`STREAM_RETRY_SECONDS`; every other outcome (no
connection, a timeout, a standby, a refusal) is the same failure as a post's, with the
same fail-over and backoff. A stream the controller closed is opened again before the
next report.

**Topology.** Every report carries the digest of the node's latest topology
(:meth:`Reporter.set_topology`, from the topology loop about once a minute); the whole
topology rides along on the first report that has one, when its digest changed since the
last one a controller accepted, and after a reply said ``topology_wanted`` (a controller
that has none for that digest: after its own restart, say). A report carrying it asks for
an answer on a stream, so that the reporter knows it arrived; one that fails is followed
by another carrying it.

A reply may carry the node-local rules the controller wants this node to evaluate
(:mod:`sn_monitor.rules.edge`): from the next report on, the agent runs them on each
sample (:class:`~sn_monitor.agent.rules.NodeRules`) and sends their findings with only
the values the controller's own rules read. Their rate and increase rules begin from the
counters kept by the agent's last run (``counter_memory``,
:mod:`sn_monitor.agent.counter_memory`), so a counter that rose during a restart fires.
Rules this agent cannot take (a newer controller's) are logged once and the reports stay
full: the controller then evaluates them itself, as it does for an agent of an earlier
version.

Its modules (a module imports only those listed before it):

* :mod:`.replies`: the reply and the failure an attempt comes back with, commands decoded
  one by one.
* :mod:`.topology`: which report carries the topology, which digest was accepted.
* :mod:`.edge_rules`: the node-local rules taken, refused and asked for again.
* :mod:`.failover`: the controllers in order, the sticky choice, the backoff, refusals
  logged once.
* :mod:`.posting`: a report posted over one keep-alive session.
* :mod:`.streaming`: a report on the reports' stream.
* :mod:`.cycle`: :class:`Reporter`, one report per sample over those parts.

Every module logs as ``sn_monitor.agent.reporter``.
"""

from sn_monitor.agent.reporter.cycle import (
    MAX_BACKOFF_SECONDS,
    MAX_EVENT_BYTES_PER_REPORT,
    Reporter,
)
from sn_monitor.agent.reporter.edge_rules import RULES_RETRY_SECONDS
from sn_monitor.agent.reporter.posting import REPORTS_PATH
from sn_monitor.agent.reporter.streaming import STREAM_RETRY_SECONDS

__all__ = [
    "MAX_BACKOFF_SECONDS",
    "MAX_EVENT_BYTES_PER_REPORT",
    "REPORTS_PATH",
    "RULES_RETRY_SECONDS",
    "STREAM_RETRY_SECONDS",
    "Reporter",
]
