"""Who is asking: bearer tokens and roles, client-certificate identities, TLS contexts.

The lowest layer with ``k8s`` and ``supervision``: imports only ``errors`` and ``audit``.
"""
