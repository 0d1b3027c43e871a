"""A training job's history with every fact its ETTR depends on, and that ETTR by hand.

Steps of 10 s from the start (time 0); saves of steps 20 (3 s of blocking) and 40 and 50
(2 s each, step 40's reported twice); a 90 s stall after step 55; a fault after step
57, 300 s down, then the job starts again from its checkpoint of step 40 and redoes
41..60. The unit test feeds it to the controller's progress, the integration test to a
real controller over HTTP; both check against :data:`KEPT` over the wall time.
"""

from __future__ import annotations

from typing import Literal

STEP = 10.0
#: ("step", step, its time) or ("save", step, blocking seconds) or ("fault", 0, its time):
#: the job stops (nothing is reported; a restore by the controller resets its ranks).
Event = tuple[Literal["step", "save", "fault"], int, float]
#: Five seconds into step 61, the last fact reported: the end of the history.
END = 1155.0

#: The productive seconds: the steps the job still has (2..60; step 1's start is not
#: known), each its last run, less the blocking saves of steps not redone (20 and 40;
#: 50 was redone).
KEPT = (
    (20 - 1) * STEP      # 2..20
    + (13.0 - 3.0)       # 21, after the 3 s save of step 20
    + (40 - 21) * STEP   # 22..40
    + (12.0 - 2.0)       # 41 (its first run), after the 2 s save of step 40
    + (60 - 41) * STEP   # 42..60, redone after the restart
)


def history() -> list[Event]:
    """The history in the order the job reports it."""
    events: list[Event] = [("step", s, STEP * (s - 1)) for s in range(1, 21)]  # 20 at 190
    events.append(("save", 20, 3.0))                    # reported before step 21
    events += [("step", s, 203 + STEP * (s - 21)) for s in range(21, 41)]  # 13 s, 3 of save
    events += [("step", 41, 405.0), ("step", 42, 415.0)]  # 41: 12 s, 2 of save
    events += [("save", 40, 2.0), ("save", 40, 2.0)]    # after the frontier passed it; twice
    events += [("step", s, 415 + STEP * (s - 42)) for s in range(43, 51)]  # 50 at 495
    events += [("step", 51, 507.0), ("save", 50, 2.0)]
    events += [("step", s, 507 + STEP * (s - 51)) for s in range(52, 56)]  # 55 at 547
    events += [("step", 56, 647.0), ("step", 57, 657.0)]  # stalled 100 s for step 56
    events.append(("fault", 0, 660.0))                  # 300 s down
    events += [("step", s, 960 + STEP * (s - 41)) for s in range(41, 61)]  # 60 at 1150
    return events
