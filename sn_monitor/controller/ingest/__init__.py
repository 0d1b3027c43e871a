"""Reports in: decoding and validating what agents send, before any rule sees it.

Imports only the vocabulary (``errors``).
"""
