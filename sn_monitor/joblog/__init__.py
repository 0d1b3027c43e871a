"""Training-log recognition: why did the job die.

Owns the signature catalogue (``signatures.yaml`` and :mod:`.catalogue`), line and block
recognition (:mod:`.recognition`), a line's rank and node (:mod:`.context`), the
ordering of findings across ranks and nodes into one root cause (:mod:`.rootcause`) and
the offline analysis of saved logs (:mod:`.analysis`). The data they share is in
:mod:`.model`; ``templates`` (the template miner) stands apart and imports nothing else
of this package.

A package layer beside :mod:`sn_monitor.rules`: the agent, the controller and the
command line may import it; it imports only the shared lower modules (config, clock,
errors).
"""
