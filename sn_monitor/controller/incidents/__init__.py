"""From finding to incident and steps, and the fleet state in memory that follows them.

- ``pipeline.py``: findings noted now, recorded by the writer as incidents, their steps
  run (or settled first); resolved ones close; the ones the store missed retried.
- ``steps.py``: what a rule's actions mean for its node (a job recovery, a ladder rung,
  an action through the runner), and running each.
- ``fleet_state.py``: what fires on each node, the lost, cordoned and evicted nodes,
  and each node's state, under one lock.
- ``engine_lock.py``: the rule engine, called under its lock.
- ``inherited.py``: the incidents a restarted controller takes over.
- ``job_health.py``: job hangs, fail-slow and stalled restores as incidents; topology.
- ``node_states.py``: the nodes' states into the store, and the store's return.
- ``job_labels.py``: the ``job`` label of a job's nodes; a node's job (blast radius).
- ``blast_radius.py``, ``escalation.py``, ``breaker.py``: a fault on many nodes of one
  job or rack, repeat offenders, the circuit breaker.

May import ``remediation``, ``telemetry`` and every part below them (``jobs``,
``failslow``, ``actions``, ``ingest``, ``fabric``, ``storage``...) and the vocabulary;
nothing but ``service`` and the layers above import it. Inside (the
``incidents-layers`` contract): what a restart inherits, the job health and the node
states over the pipeline, over the steps and the screens, over the fleet state.
"""
