"""Per-workload efficiency: whose workloads hold the fleet's GPUs, and what each gets of them.

The agents say which workloads hold each GPU (:class:`~sn_monitor.model.GpuWorkloadReport`);
:mod:`.accounting` keeps each GPU's latest holders and activity from the reports and
sums them per workload: GPUs held and idle, SM utilization, memory, energy. May import
:mod:`sn_monitor.model`, :mod:`sn_monitor.clock` and :mod:`sn_monitor.config`, nothing
else of the controller.
"""
