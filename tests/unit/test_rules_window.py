"""Rate / increase windows keep a bounded number of samples, within one bucket of exact."""

from __future__ import annotations

import bisect
import random
from array import array

from sn_monitor.rules.threshold import BUCKETS, MAX_SAMPLES, slide


def _reference(times: list[float], values: list[float], t: float) -> int:
    """Index of the exact anchor: the newest sample at or before ``t`` (else the oldest)."""
    return max(bisect.bisect_right(times, t) - 1, 0)


def test_samples_stay_bounded_and_results_within_one_bucket_of_exact():
    rng = random.Random(7)
    window = 60.0
    width = window / BUCKETS
    samples: array[float] = array("d")
    times: list[float] = []
    values: list[float] = []
    value = 0.0
    most = 0
    for k in range(10_000):  # 10 Hz for 1,000 s: bursts, quiet spells, single steps
        t = k / 10
        phase = (k // 500) % 3
        if phase == 0:
            value += rng.randint(0, 5)
        elif phase == 1 and rng.random() < 0.01:
            value += 1
        times.append(t)
        values.append(value)
        if not slide(samples, t, value, window, width):
            assert k == 0
            continue
        most = max(most, len(samples) // 2)
        t0, v0 = samples[0], samples[1]
        exact = _reference(times, values, t - window)
        te, ve = times[exact], values[exact]
        # The anchor is a real sample, at most one bucket older than the exact one.
        assert te - width < t0 <= te
        i0 = bisect.bisect_left(times, t0)
        assert (times[i0], values[i0]) == (t0, v0)
        # Increase: never below the exact one, never above the increase over one more bucket.
        low = value - ve
        high = value - values[_reference(times, values, te - width)]
        assert low <= value - v0 <= high
        # Rate: between the bounds those give over a span up to one bucket longer.
        if t > te:
            rate = (value - v0) / (t - t0)
            assert low / (t - te + width) - 1e-9 <= rate <= high / (t - te) + 1e-9
    assert most <= MAX_SAMPLES
    assert most < 100  # versus 600 samples for every minute at 10 Hz before


def test_a_steady_rate_is_exact_and_a_flat_counter_keeps_one_sample_per_bucket():
    window = 300.0
    samples: array[float] = array("d")
    for k in range(10_000):
        slide(samples, k / 10, 7.0 * k, window, window / BUCKETS)
        if k > 10:
            assert abs((7.0 * k - samples[1]) / (k / 10 - samples[0]) - 70.0) < 1e-6
    flat: array[float] = array("d")
    for k in range(10_000):
        slide(flat, k / 10, 5.0, window, window / BUCKETS)
    assert len(flat) // 2 <= BUCKETS + 2


def test_a_counter_reset_starts_over_and_single_steps_are_exact():
    window, width = 300.0, 300.0 / BUCKETS
    samples: array[float] = array("d")
    for k in range(100):
        slide(samples, float(k), 10.0 if k < 50 else 11.0, window, width)
    assert samples[1] == 10.0  # the anchor holds the value before the step
    assert not slide(samples, 100.0, 3.0, window, width)  # reset: one sample, no rate
    assert list(samples) == [100.0, 3.0]
    # A step at 50 leaves the window exactly when its sample does (t = 350 > 50 + 300).
    samples = array("d")
    for k in range(351):
        slide(samples, float(k), 10.0 if k < 50 else 11.0, window, width)
        increase = (10.0 if k < 50 else 11.0) - samples[1]
        assert increase == (1.0 if 50 <= k < 350 else 0.0), k
