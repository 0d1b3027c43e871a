"""The judgement of ``sn-monitor slurm-health`` over an agent's /metrics (pure functions)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sn_monitor.cli.slurm_health import DEFAULT_AGENT_URL
from sn_monitor.slurm_health import (
    DEFAULT_AGENT,
    HEALTH_PREFIX,
    Verdict,
    judge_metrics,
    parse_samples,
)

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "golden" / "h100-node.prom"


def _set(text: str, prefix: str, value: str) -> str:
    """Every sample line starting with ``prefix`` gets ``value``."""
    return "\n".join(f"{line.rsplit(' ', 1)[0]} {value}" if line.startswith(prefix) else line
                     for line in text.splitlines())


#: The golden exposition of tests/fixtures/h100-node, whose GPU 6 waits for a row remap.
AS_IS = FIXTURE.read_text()
GOLDEN = "\n".join(f"{line.rsplit(' ', 1)[0]} 0.0"
                   if line.startswith("sn_gpu_row_remap_pending") else line
                   for line in AS_IS.splitlines())


def test_the_fixture_node() -> None:
    assert judge_metrics(AS_IS) == ["GPU 6 row remap pending (needs a reset)"]


def test_a_healthy_node() -> None:
    assert judge_metrics(GOLDEN) == []
    assert judge_metrics(GOLDEN, expected_gpus=8) == []
    assert judge_metrics(GOLDEN, expected_gpus=9) == ["8 GPUs present, 9 expected"]


@pytest.mark.parametrize(("prefix", "value", "problem"), [
    ('sn_gpu_lost{gpu="5"', "1.0", "GPU 5 lost (fallen off the bus or NVML errors)"),
    ('sn_gpu_row_remap_pending{gpu="2"', "1.0", "GPU 2 row remap pending (needs a reset)"),
    ('sn_gpu_row_remap_failed{gpu="1"', "1.0", "GPU 1 row remap failed (needs an RMA)"),
    ('sn_gpu_ecc_uncorrected_errors_total{gpu="3"', "2.0",
     "GPU 3 uncorrectable ECC errors since the last reset"),
    ('sn_gpu_nvlink_up{gpu="0",link="1"', "0.0", "NVLink down: GPU 0 link 1"),
    ('sn_agent_collector_success{collector="nvml"', "0.0",
     "the agent cannot read the GPUs (nvml collector failing)"),
])
def test_each_problem(prefix: str, value: str, problem: str) -> None:
    assert judge_metrics(_set(GOLDEN, prefix, value)) == [problem]


def test_several_gpus_and_the_reason() -> None:
    text = _set(_set(GOLDEN, 'sn_gpu_lost{gpu="7"', "1.0"), 'sn_gpu_lost{gpu="2"', "1.0")
    problems = judge_metrics(text)
    assert problems == ["GPU 2,7 lost (fallen off the bus or NVML errors)"]
    reason = Verdict("agent", tuple(problems * 20)).reason
    assert reason.startswith(f"{HEALTH_PREFIX} GPU 2,7 lost")
    assert len(reason) <= 200


def test_parse_samples() -> None:
    samples = parse_samples('# HELP x y\nx{a="1",b="q\\"v"} 2.5\nbad line\ny 3\n')
    assert [(s.name, s.labels, s.value) for s in samples] == [
        ("x", {"a": "1", "b": 'q\\"v'}, 2.5), ("y", {}, 3.0)]


def test_the_cli_default_is_the_modules() -> None:
    assert DEFAULT_AGENT_URL == DEFAULT_AGENT
