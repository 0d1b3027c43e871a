"""Goodput replays: a failure trace on a simulated job, every policy side by side.

- :mod:`.trace`: the faults (a published catalogue drawn for a seed, a user's file, a
  controller's recorded incidents);
- :mod:`.world`: what is simulated (the job's progress, checkpoints, restarts, nodes);
- :mod:`.baselines`: Kubernetes alone and torchrun elastic, as their timings;
- :mod:`.intervals`: the checkpoint interval a policy runs at (fixed, Daly's, its best);
- :mod:`.controlled`: sn-monitor itself, the real controller on a virtual clock;
- :mod:`.replay`, :mod:`.results`, :mod:`.command`: the run, its table, the subcommand.
"""
