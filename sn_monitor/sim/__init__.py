"""Simulated GPUs and nodes: the same agent code runs here without a GPU.

From the top (``.importlinter``'s ``sim-layers``, each module imports only those below
it): ``demo`` plays a scenario on a ``supernode`` (a controller, agent processes, the
example job of ``train`` started by ``launcher``); ``fleet`` is ``sn-monitor
simulate``'s thousands of nodes in one process, sending through ``fleet_client`` the
reports of ``fleet_node``; ``scenario`` reads the fault files; ``node`` is one simulated
agent's node (``fake_nvml``, ``node_tree`` with ``tree_files`` and ``host_model``,
the faults, ``gpu_fail_slow`` among them); ``failslow`` models a job slowed by
fail-slow faults and ``pace`` hands that slowdown to the demo's ranks; ``hgx`` is the
HGX topology; ``gpu_model`` the GPU, at the bottom.

It may import the agent (the collectors, rules and checks a simulated node runs) and
what the agent and the controller share (the model, the report stream, the rules, the
client, the configuration); never the controller, which it runs as a process.
"""
