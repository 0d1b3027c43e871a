"""The controller: ingest reports, apply rules, open incidents, act safely, record it all.

The flow a report takes, and the folder that owns each step (layers point down; the
import contract in ``.importlinter`` names the same folders):

- ``process/``: the ``sn-monitor controller`` process: serve, lead or stand by, stop.
- ``api/``: the HTTP edge: routes, OpenAPI, the report and stream lanes, bodies, UI.
- ``service/``: :class:`~sn_monitor.controller.service.Controller`, the composition
  root that wires the parts below and runs the sweep; the report intake, the read API,
  the audited changes.
- ``settings.py``: the controller's configuration file, gathering each part's settings.
- ``incidents/``: findings become incidents and steps (blast radius, escalation, the
  circuit breaker), the fleet state in memory, what a restart inherits, job hangs.
- ``remediation/``: the repair ladder and the return to service.
- ``telemetry/``: the controller's own metrics (sn_controller_*), formatted from snapshots.
- ``jobs/`` and ``failslow/``: training jobs and their recovery; slow ranks and links.
- ``ingest/``, ``actions/``, ``ha/``, ``fabric/``: decoding reports, running audited
  actions through drivers, leadership of a pair, the NVLink/RDMA fabric view.
- ``storage/``: the store (SQLite or PostgreSQL), its writer thread and health.
- ``k8s/``, ``supervision/``, ``security/``: the Kubernetes client plumbing, supervised
  workers and the loop-stall watch, authentication and TLS.
- ``audit.py``, ``errors.py``: the vocabulary every part shares (action records, errors).
"""
