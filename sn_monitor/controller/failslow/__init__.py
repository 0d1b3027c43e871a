"""Fail-slow: a job that runs, slower, and the node and link that hold it back.

``fabric_watch.py`` holds the finder, its meter and book, and the watch behind the
fabric lock every report takes. May import ``fabric``, the parts below it and the
vocabulary; not ``jobs`` (a job's pace comes in as a :class:`~.watch.JobPace`).
"""
