"""The controller's own metrics: counters and histograms it observes, state read at scrape time.

Exposition only formats a :class:`~sn_monitor.controller.telemetry.metrics.ControllerState`
snapshot; it decides nothing. Imports ``jobs`` views and the vocabulary.
"""
