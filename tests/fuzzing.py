"""How much property-based testing to do: a bounded budget in ``make test``, a big one in
``make fuzz``.

Property tests give their budget as ``max_examples=examples(N)``: N in ``make test``
(each file well under 30 s here), N * :data:`FUZZ_FACTOR` when ``SN_HYPOTHESIS_PROFILE``
is ``fuzz`` (``make fuzz`` sets it). That profile also becomes Hypothesis' default for
tests that name no budget, without deadlines.
"""

from __future__ import annotations

import os

from hypothesis import settings

PROFILE = os.environ.get("SN_HYPOTHESIS_PROFILE", "default")
FUZZ_FACTOR = 20

settings.register_profile("fuzz", max_examples=2000, deadline=None)
if PROFILE == "fuzz":
    settings.load_profile("fuzz")
elif PROFILE != "default":
    raise ValueError(f"SN_HYPOTHESIS_PROFILE must be default or fuzz, not {PROFILE!r}")


def examples(budget: int) -> int:
    """``budget`` examples, or :data:`FUZZ_FACTOR` times as many under ``make fuzz``."""
    return budget * FUZZ_FACTOR if PROFILE == "fuzz" else budget
