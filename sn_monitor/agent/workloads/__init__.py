"""Whose workload is on a GPU: the platforms' answers, as the agent reads them.

Each source says which workload holds which device, from what the platform itself
records: the kubelet's pod-resources API (``kubelet``), Slurm's cgroups and job
environment (``slurm``). Sources are optional and fail soft: one that cannot be read
raises :class:`~sn_monitor.agent.workloads.model.SourceUnavailable`, and the collector
that uses them (``agent/collectors/``) drops that source for the cycle, never the sample.

May import: the standard library, ``sn_monitor.agent.snapshot``, ``sn_monitor.clock``,
``sn_monitor.program`` (a platform's command line tool: Slurm's ``scontrol``);
optional extras (``grpcio``) only inside the source that needs them.
"""
