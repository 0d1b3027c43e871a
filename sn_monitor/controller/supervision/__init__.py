"""The controller watching itself: supervised workers, a stop deadline, the loop-stall watch.

Imports nothing of the controller: every layer above may use it.
"""
