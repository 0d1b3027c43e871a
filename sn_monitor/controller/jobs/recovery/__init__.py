"""Job recovery in motion: its steps (machine) and the engine that drives them.

The recovery as data is :mod:`sn_monitor.controller.jobs.recovery_record`.
"""
