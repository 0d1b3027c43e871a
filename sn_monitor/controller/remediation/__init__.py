"""The repair ladder of a faulty node, and its return to service after a repair.

May import ``jobs``, ``actions``, ``storage`` and the vocabulary; not ``incidents``
(which starts repairs: it sits above).
"""
