"""Simulated GPUs and nodes: the same agent code runs here without a GPU."""
