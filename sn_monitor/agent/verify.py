"""Return-to-service checks: whether this node is fit to take work again.

Before a repaired node is uncordoned (or given to a job as a spare), the controller asks
its agent to ``verify`` (:mod:`sn_monitor.agent.commands`); an operator runs the same
checks with ``sn-monitor verify``. Each check is a :class:`CheckResult` (name, ok,
detail), so the controller can say *why* a node stays out.

The snapshot checks are pure functions of one :class:`NodeSnapshot` taken after the
question was asked:

* ``gpus-present``: as many GPUs as expected (the ``expected_gpus`` setting, else the most
  this agent has seen on the node: :class:`GpuCountMemory`, which survives a reboot that
  lost a GPU);
* ``gpus-reachable``: none lost (fallen off the bus, NVML errors);
* ``row-remap``: no row remap pending (needs a reset) and none failed (needs an RMA);
* ``pcie-links``: every link at its maximum width, and at its maximum generation *unless
  the GPU is idle*: an idle GPU lowers its link's generation to save power, so a
  generation below the maximum fails only while the GPU is busy (a width below the
  maximum always fails: links do not narrow to save power). After a reset the GPUs are
  idle, so the generation is proven only under load: DCGM's level 2 ``pcie`` test or the
  user command provide that load;
* ``nvlinks``: every NVLink up;
* ``temperatures``: every GPU below its slowdown temperature minus a margin;
* ``ecc-uncorrectable``: no uncorrectable ECC error in the volatile counters, which start
  again at every GPU reset and driver load: none since the reset.

Then two that run programs: DCGM's diagnostic (``dcgmi diag -r LEVEL -j``, parsed by
:func:`parse_dcgm_diag`; skipped with a note where dcgmi is not installed) and an
optional user command (an NCCL all-reduce test) that must exit 0 within its timeout.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sn_monitor.agent.settings import VerifySettings
from sn_monitor.agent.snapshot import GpuSample, NodeSnapshot
from sn_monitor.model import MAX_CHECKS, CheckResult
from sn_monitor.program import Finished, ProgramTimeout, run_program, tail

log = logging.getLogger(__name__)

#: Below this SM utilization a GPU counts as idle (its PCIe link may run slower).
IDLE_UTILIZATION = 0.05
_DETAIL_MAX = 1024

#: Runs a program: ``run(argv, timeout=...)`` (tests pass the real one with tiny scripts).
Runner = Callable[..., Finished]
#: Finds a program on PATH (``shutil.which``).
Which = Callable[[str], str | None]


def _check(name: str, ok: bool, detail: str, skipped: bool = False) -> CheckResult:
    if len(detail) > _DETAIL_MAX:
        detail = detail[:_DETAIL_MAX - 3] + "..."
    return CheckResult(name=name, ok=ok, detail=detail, skipped=skipped)


def _reachable(snapshot: NodeSnapshot) -> list[GpuSample]:
    return [gpu for gpu in snapshot.gpus if not gpu.lost]


# --------------------------------------------------------------------------- snapshot checks


def check_gpus_present(snapshot: NodeSnapshot, expected: int, source: str = "") -> CheckResult:
    """At least ``expected`` GPUs enumerated (lost ones count: ``gpus-reachable`` has them)."""
    count = len(snapshot.gpus)
    why = f" ({source})" if source else ""
    if count < expected:
        return _check("gpus-present", False, f"{count} GPUs present, {expected} expected{why}")
    return _check("gpus-present", True, f"{count} of {expected} GPUs present{why}")


def check_gpus_reachable(snapshot: NodeSnapshot) -> CheckResult:
    """No GPU lost: NVML reaches every one."""
    lost = [gpu.index for gpu in snapshot.gpus if gpu.lost]
    if lost:
        return _check("gpus-reachable", False,
                      "lost (NVML cannot reach it): " + ", ".join(f"GPU {i}" for i in lost))
    return _check("gpus-reachable", True, f"NVML reaches all {len(snapshot.gpus)} GPUs")


def check_row_remap(snapshot: NodeSnapshot) -> CheckResult:
    """No row remap pending (it takes effect at the next reset) and none failed (RMA)."""
    gpus = [g for g in _reachable(snapshot)
            if g.row_remap_pending is not None or g.row_remap_failed is not None]
    if not gpus:
        return _check("row-remap", True, "row remapping not reported by any GPU", skipped=True)
    problems = []
    for gpu in gpus:
        if gpu.row_remap_failed:
            problems.append(f"GPU {gpu.index}: a row remap failed (the GPU needs replacing)")
        if gpu.row_remap_pending:
            problems.append(f"GPU {gpu.index}: a row remap is pending (reset the GPU)")
    if problems:
        return _check("row-remap", False, "; ".join(problems))
    return _check("row-remap", True, f"no remap pending or failed on {len(gpus)} GPUs")


def is_idle(gpu: GpuSample) -> bool:
    """Whether the GPU is idle (or its load unknown): its PCIe generation may be lowered."""
    if gpu.throttle_reasons is not None and dict(gpu.throttle_reasons).get("gpu_idle"):
        return True
    return gpu.utilization_ratio is None or gpu.utilization_ratio < IDLE_UTILIZATION


def check_pcie_links(snapshot: NodeSnapshot) -> CheckResult:
    """Every link at its maximum width; at its maximum generation unless the GPU is idle."""
    problems: list[str] = []
    notes: list[str] = []
    seen = 0
    for gpu in _reachable(snapshot):
        width, width_max = gpu.pcie_link_width, gpu.pcie_link_width_max
        gen, gen_max = gpu.pcie_link_generation, gpu.pcie_link_generation_max
        if width is not None and width_max is not None:
            seen += 1
            if width < width_max:
                problems.append(f"GPU {gpu.index}: link x{width}, max x{width_max}")
        if gen is not None and gen_max is not None:
            seen += 1
            if gen < gen_max:
                if is_idle(gpu):
                    notes.append(f"GPU {gpu.index} idle at gen {gen} of {gen_max}")
                else:
                    problems.append(f"GPU {gpu.index}: gen {gen} under load, max gen {gen_max}")
    if not seen:
        return _check("pcie-links", True, "PCIe link width and generation not reported",
                      skipped=True)
    note = ("; " + ", ".join(notes) + " (idle links slow down to save power)") if notes else ""
    if problems:
        return _check("pcie-links", False, "; ".join(problems) + note)
    return _check("pcie-links", True, "every link at its maximum width" + note)


def check_nvlinks(snapshot: NodeSnapshot) -> CheckResult:
    """Every NVLink up."""
    down: list[str] = []
    known = 0
    for gpu in _reachable(snapshot):
        links = [link for link in gpu.nvlinks if link.up is not None]
        known += len(links)
        ids = [str(link.link) for link in links if not link.up]
        if ids:
            down.append(f"GPU {gpu.index} link{'s' if len(ids) > 1 else ''} {','.join(ids)}")
    if not known:
        return _check("nvlinks", True, "no NVLink reported on this node", skipped=True)
    if down:
        return _check("nvlinks", False, "down: " + "; ".join(down))
    return _check("nvlinks", True, f"all {known} NVLinks up")


def check_temperatures(snapshot: NodeSnapshot, margin: float) -> CheckResult:
    """Every GPU below its slowdown temperature minus ``margin`` °C."""
    hot: list[str] = []
    checked = 0
    for gpu in _reachable(snapshot):
        temp, slowdown = gpu.temperature_celsius, gpu.slowdown_temperature_celsius
        if temp is None or slowdown is None:
            continue
        checked += 1
        if temp >= slowdown - margin:
            hot.append(f"GPU {gpu.index} at {temp:g} °C (slowdown {slowdown:g} °C, "
                       f"margin {margin:g})")
    if not checked:
        return _check("temperatures", True, "no GPU reports its temperature and slowdown",
                      skipped=True)
    if hot:
        return _check("temperatures", False, "; ".join(hot))
    return _check("temperatures", True,
                  f"{checked} GPUs at least {margin:g} °C below their slowdown temperature")


def check_ecc(snapshot: NodeSnapshot) -> CheckResult:
    """No uncorrectable ECC error since the last reset (the volatile counter)."""
    counted = [g for g in _reachable(snapshot) if g.ecc_uncorrected_errors_total is not None]
    if not counted:
        return _check("ecc-uncorrectable", True, "ECC not reported (off, or not supported)",
                      skipped=True)
    bad = [f"GPU {g.index}: {g.ecc_uncorrected_errors_total}" for g in counted
           if g.ecc_uncorrected_errors_total]
    if bad:
        return _check("ecc-uncorrectable", False,
                      "uncorrectable ECC errors since the last reset: " + ", ".join(bad))
    return _check("ecc-uncorrectable", True,
                  f"no uncorrectable ECC error since the last reset on {len(counted)} GPUs")


def snapshot_checks(snapshot: NodeSnapshot, settings: VerifySettings, expected: int,
                    expected_source: str = "") -> list[CheckResult]:
    """Every check over one snapshot, in a fixed order."""
    return [
        check_gpus_present(snapshot, expected, expected_source),
        check_gpus_reachable(snapshot),
        check_row_remap(snapshot),
        check_pcie_links(snapshot),
        check_nvlinks(snapshot),
        check_temperatures(snapshot, settings.temperature_margin),
        check_ecc(snapshot),
    ]


# --------------------------------------------------------------------------- DCGM


def _diagnostic(doc: Any) -> dict[str, Any] | None:
    """The results object: ``DCGM Diagnostic`` (DCGM 4), ``DCGM GPU Diagnostic`` (2, 3)."""
    if not isinstance(doc, dict):
        return None
    for key in ("DCGM Diagnostic", "DCGM GPU Diagnostic"):
        body = doc.get(key)
        if isinstance(body, dict):
            return body
    return None


def _entity(result: dict[str, Any]) -> str:
    for key in ("entity_id", "gpu_id"):
        if isinstance(result.get(key), int | str):
            return f"GPU {result[key]}"
    ids = result.get("gpu_ids")  # DCGM 2/3: a list, or a string such as "0,1"
    if isinstance(ids, list) and ids:
        return "GPU " + ",".join(map(str, ids))
    if isinstance(ids, str | int) and str(ids).strip():
        return f"GPU {str(ids).strip()}"
    return ""


def _warnings(result: dict[str, Any]) -> str:
    items = result.get("warnings")
    texts: list[str] = []
    for item in items if isinstance(items, list) else []:
        if isinstance(item, dict) and isinstance(item.get("warning"), str):
            code = item.get("error_id")
            texts.append(item["warning"] + (f" [error {code}]" if isinstance(code, int) else ""))
        elif isinstance(item, str):
            texts.append(item)
    return " ".join(" ".join(texts).split())


def parse_dcgm_diag(text: str, level: int | None = None) -> CheckResult:
    """Judge ``dcgmi diag -j`` output: any Fail fails; no test that ran fails too.

    Statuses are Pass, Fail, Warn, Skip and Not Run. A Warn passes (it is listed); a
    result where every test was skipped fails, because a node DCGM declined to test is
    not a node DCGM found healthy. NVIDIA publishes no stable schema: both the DCGM 4
    shape (``DCGM Diagnostic``, ``entity_id``) and the DCGM 2/3 one (``DCGM GPU
    Diagnostic``, ``gpu_ids``) are read.
    """
    name = "dcgm-diag"
    suite = f"level {level}" if level is not None else "dcgmi diag"
    try:
        doc = json.loads(text)
    except ValueError:
        return _check(name, False, f"{suite}: output is not JSON: {tail(text, 200) or '(none)'}")
    body = _diagnostic(doc)
    if body is None:
        return _check(name, False, f"{suite}: no 'DCGM Diagnostic' object in the output")
    error = body.get("runtime_error")
    if isinstance(error, str) and error.strip():
        return _check(name, False, f"{suite}: dcgmi could not run: {' '.join(error.split())}")
    tally = _DiagTally()
    for test_name, result in _results(body):
        tally.count(test_name, result)
    return tally.verdict(name, suite)


def _results(body: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(test name, result object) for every result of every test; malformed parts skipped."""
    categories = body.get("test_categories")
    for category in categories if isinstance(categories, list) else []:
        tests = category.get("tests") if isinstance(category, dict) else None
        for test in tests if isinstance(tests, list) else []:
            if not isinstance(test, dict):
                continue
            test_name = str(test.get("name", "?"))
            results = test.get("results")
            for result in results if isinstance(results, list) else []:
                if isinstance(result, dict):
                    yield test_name, result


@dataclass
class _DiagTally:
    """The results of one ``dcgmi diag`` by status: failures, warnings, passes, not run."""

    failed: list[str] = field(default_factory=list)
    warned: list[str] = field(default_factory=list)
    passed: int = 0
    not_run: int = 0

    def count(self, test_name: str, result: dict[str, Any]) -> None:
        status = str(result.get("status", "")).strip().lower()
        where = " ".join(filter(None, (test_name, _entity(result))))
        why = _warnings(result)
        if status == "fail":
            self.failed.append(f"{where}: {why}" if why else where)
        elif status in ("warn", "warning"):
            self.passed += 1
            self.warned.append(f"{where}: {why}" if why else where)
        elif status == "pass":
            self.passed += 1
        else:  # skip, not run
            self.not_run += 1

    def verdict(self, name: str, suite: str) -> CheckResult:
        """Any Fail fails; no test that ran fails too; a Warn passes and is listed."""
        if self.failed:
            return _check(name, False, f"{suite} failed: " + "; ".join(self.failed))
        if not self.passed:
            return _check(name, False,
                          f"{suite} ran no test ({self.not_run} skipped or not run)")
        detail = f"{suite}: {self.passed} results passed"
        if self.not_run:
            detail += f", {self.not_run} skipped"
        if self.warned:
            detail += "; warnings: " + "; ".join(self.warned)
        return _check(name, True, detail)


def run_dcgm(settings: VerifySettings, *, which: Which = shutil.which,
             run: Runner = run_program) -> CheckResult:
    """``dcgmi diag -r LEVEL -j`` when dcgmi is installed; skipped with a note otherwise."""
    if settings.dcgm_level == 0:
        return _check("dcgm-diag", True, "switched off (dcgm_level: 0)", skipped=True)
    program = which(settings.dcgmi)
    if program is None:
        return _check("dcgm-diag", True, f"dcgmi not installed ({settings.dcgmi} not on PATH)",
                      skipped=True)
    argv = [program, "diag", "-r", str(settings.dcgm_level), "-j"]
    try:
        done = run(argv, timeout=settings.dcgm_timeout)
    except ProgramTimeout as err:
        return _check("dcgm-diag", False, str(err))
    except OSError as err:
        return _check("dcgm-diag", False, f"cannot run {program}: {err.strerror}")
    result = parse_dcgm_diag(done.stdout, settings.dcgm_level)
    if not result.ok and _diagnostic(_json_or_none(done.stdout)) is None and done.returncode:
        return _check("dcgm-diag", False,
                      f"dcgmi diag exited {done.returncode}: {done.tail()}")
    return result


def _json_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


# --------------------------------------------------------------------------- user command


def run_user_command(argv: Sequence[str] | None, timeout: float, *,
                     run: Runner = run_program) -> CheckResult:
    """The operator's own test (an NCCL all-reduce): exit 0 within ``timeout`` passes."""
    name = "user-command"
    if not argv:
        return _check(name, True, "none configured", skipped=True)
    program = argv[0]
    try:
        done = run(list(argv), timeout=timeout)
    except ProgramTimeout as err:
        return _check(name, False, str(err))
    except OSError as err:
        return _check(name, False, f"cannot run {program}: {err.strerror}")
    if done.returncode == 0:
        return _check(name, True, f"{program} exited 0")
    if done.returncode < 0:
        return _check(name, False, f"{program} killed by signal {-done.returncode}: "
                                   f"{done.tail()}")
    return _check(name, False, f"{program} exited {done.returncode}: {done.tail()}")


# --------------------------------------------------------------------------- the whole


class GpuCountMemory:
    """The most GPUs this agent has seen on the node, kept in ``state_dir/gpu-count``.

    After a reboot that lost a GPU, NVML enumerates one fewer and "the count seen at
    start" would be the broken one; this file remembers the healthy count. Delete it (or
    set ``expected_gpus``) after taking a GPU out on purpose. ``state_dir`` None: memory
    only.
    """

    FILE = "gpu-count"

    def __init__(self, state_dir: Path | None) -> None:
        self._path = state_dir / self.FILE if state_dir is not None else None
        self._max = self._read()

    def _read(self) -> int:
        if self._path is None:
            return 0
        try:
            return max(0, int(self._path.read_text(encoding="utf-8").strip()))
        except FileNotFoundError:
            return 0
        except (OSError, ValueError) as err:
            log.warning("cannot read %s (%s): the GPU count starts again", self._path, err)
            return 0

    @property
    def most_seen(self) -> int:
        return self._max

    def observe(self, count: int) -> None:
        """Remember ``count`` when it is the most seen so far."""
        if count <= self._max:
            return
        self._max = count
        if self._path is not None:
            try:
                self._path.write_text(f"{count}\n", encoding="utf-8")
            except OSError as err:
                log.warning("cannot write %s: %s", self._path, err)

    def expected(self, configured: int | None) -> tuple[int, str]:
        """How many GPUs the node must have, and where that number comes from."""
        if configured is not None:
            return configured, "expected_gpus"
        return self._max, "the most this agent has seen here"


def verify_node(snapshot: NodeSnapshot, settings: VerifySettings, memory: GpuCountMemory,
                *, which: Which = shutil.which, run: Runner = run_program,
                extra: Iterable[CheckResult] = ()) -> list[CheckResult]:
    """Every check, snapshot ones first, then DCGM, then the user command (bounded)."""
    memory.observe(len(snapshot.gpus))
    expected, source = memory.expected(settings.expected_gpus)
    checks = [*extra, *snapshot_checks(snapshot, settings, expected, source)]
    checks.append(run_dcgm(settings, which=which, run=run))
    checks.append(run_user_command(settings.command, settings.command_timeout, run=run))
    return checks[:MAX_CHECKS]


def summary(checks: Sequence[CheckResult]) -> str:
    """One line: passed, or which checks failed."""
    failed = [c.name for c in checks if not c.ok]
    skipped = sum(1 for c in checks if c.skipped)
    if failed:
        return f"verification failed: {', '.join(failed)}"
    ran = len(checks) - skipped
    return f"verification passed: {ran} checks" + (f", {skipped} skipped" if skipped else "")
