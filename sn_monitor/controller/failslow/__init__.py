"""Fail-slow: a job that runs, slower, and the node and link that hold it back."""
