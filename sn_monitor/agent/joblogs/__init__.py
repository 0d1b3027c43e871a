"""The job's own logs, read on the agent: files, container logs and journald units.

One thread (``agent-joblogs``, :mod:`.reader`) polls every configured source and hands
typed :class:`~.lines.LogLine` records to a bounded queue; nothing here runs on the
sampling thread. Reading is bounded three ways: a token bucket in bytes per second per
stream and one for all of them (:mod:`.bounds`: over it, the oldest unread bytes are
skipped, never buffered), a bounded line length and a bounded queue (drop oldest).

* :mod:`.lines`: the line record and where it came from (job, rank, node, pod);
* :mod:`.stats`: per-source counters and their typed snapshot;
* :mod:`.bounds`: the token bucket and the bounded queue;
* :mod:`.paths`: rank and node from a file's path, pod and container from a CRI name;
* :mod:`.framing`, :mod:`.cri`: raw lines to records (plain text, the CRI log format);
* :mod:`.journal`: one ``journalctl -o json`` entry to records (pure);
* :mod:`.tail`: one open file followed through truncation;
* :mod:`.fileset`: a glob's files followed through rotation, with an open-files bound;
* :mod:`.journalctl`: a unit followed through a ``journalctl --follow`` subprocess;
* :mod:`.reader`: the thread that polls the sources;
* :mod:`.findings`: the lines recognised (:mod:`sn_monitor.joblog`), findings as ``log``
  events, the template miners, the ECS output;
* :mod:`.build`: the sources and the reader from the ``job_logs`` settings;
* :mod:`.collector`: the collector the sampler asks each cycle for the findings waiting.

May import: the standard library, ``sn_monitor.agent.settings``, ``sn_monitor.agent.snapshot``,
``sn_monitor.clock``, ``sn_monitor.joblog``, ``sn_monitor.model``.
"""
