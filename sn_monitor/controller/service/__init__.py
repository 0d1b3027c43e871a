"""The composition root: :class:`Controller` wires the parts below and runs the sweep.

- ``controller.py``: :class:`Controller`: the parts wired, started and stopped, the
  sweep's schedule, and the calls the API and the daemon make (each one part's).
- ``intake.py``: the hot path: agents' reports and Alertmanager's alerts in.
- ``queries.py``: the read API's documents (nodes, incidents, actions, jobs, health).
- ``commands.py``: manual actions, approvals and the breaker by hand, audited.
- ``job_desk.py``: the API's job changes (audited) and the ranks' progress reports.
- ``topology_desk.py``: the topology's answers, built once per update for every viewer.
- ``snapshot.py``: the state the controller's own metrics show, gathered at a scrape.
- ``audit_trail.py``: the audit records of API calls that are not driver actions.

May import every part of the controller below it (``settings`` and down); nothing below
imports it. Inside (the ``service-layers`` contract), ``controller`` imports the others;
``commands`` and ``job_desk`` the audit trail, and ``commands`` the documents of
``queries``.
"""

from sn_monitor.controller.service.controller import Controller

__all__ = ["Controller"]
