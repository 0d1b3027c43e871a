"""From finding to incident: blast-radius limits, escalation, the circuit breaker.

May import ``jobs``, ``actions``, ``storage`` and the vocabulary; not ``remediation``.
"""
