"""High availability: two controllers, one active, the other standing by.

The active controller holds a lease (a row in the shared PostgreSQL store, or a
Kubernetes Lease) and renews it; the standby keeps trying to take it. Every write that
records a decision to act checks the store's fencing epoch, so a controller that lost
its lease without noticing (a long GC pause, a partition) cannot act after its successor
took over. See :mod:`.lease` for the contract, :mod:`.elector` for the loop.
"""
