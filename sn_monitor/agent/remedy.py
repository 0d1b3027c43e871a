"""What resets a GPU and reboots the node: the agent's side of the remediation ladder.

NVML has no call that resets a GPU on most boards (nvidia-ml-py 13.615 has none:
``nvmlDeviceRemoveGpu`` / ``nvmlDeviceDiscoverGpus`` detach and re-attach a device on
the PCI bus, which is not a reset), so a reset is a configured program, by default
``nvidia-smi --gpu-reset -i {gpu}``; a reboot is ``systemctl reboot``. Both run through
an :class:`Actuator`: :class:`ProgramActuator` on a real node, the simulator's own on a
simulated one (it resets the fake GPUs).

A reboot ends the agent before its result can be reported, and the controller sends a
command again until it sees a result: :class:`RebootLedger` writes the command id (and
the kernel's boot id) to the state directory *before* the reboot runs, so the agent
that starts after it answers the repeat ("rebooted") instead of rebooting again.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from sn_monitor.agent.settings import GPU_PLACEHOLDER, RemediationSettings
from sn_monitor.program import ProgramTimeout, run_program

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ActOutcome:
    """What a reset or a reboot did; ``message`` is for the controller's audit trail."""

    ok: bool
    message: str


class Actuator(Protocol):
    """Resets one GPU, reboots the node; says what it would run (for dry runs)."""

    def describe_reset(self, gpu: int) -> str:
        """What a reset of ``gpu`` runs, for "would run ..."."""
        ...

    def reset_gpu(self, gpu: int) -> ActOutcome:
        """Reset ``gpu`` (the caller has checked that no process uses it)."""
        ...

    def describe_reboot(self) -> str:
        """What a reboot runs."""
        ...

    def reboot(self) -> ActOutcome:
        """Reboot the node (the caller has logged and recorded it)."""
        ...


def reset_argv(settings: RemediationSettings, gpu: int) -> list[str]:
    """``reset_command`` with ``{gpu}`` replaced by the index (no other braces are read)."""
    return [part.replace(GPU_PLACEHOLDER, str(gpu)) for part in settings.reset_command]


class ProgramActuator:
    """Runs the configured programs, without a shell, each within ``timeout``."""

    def __init__(self, settings: RemediationSettings) -> None:
        self.settings = settings

    def describe_reset(self, gpu: int) -> str:
        return " ".join(reset_argv(self.settings, gpu))

    def reset_gpu(self, gpu: int) -> ActOutcome:
        return self._run(reset_argv(self.settings, gpu), f"reset GPU {gpu}")

    def describe_reboot(self) -> str:
        return " ".join(self.settings.reboot_command)

    def reboot(self) -> ActOutcome:
        return self._run(list(self.settings.reboot_command), "reboot")

    def _run(self, argv: list[str], what: str) -> ActOutcome:
        command = " ".join(argv)
        try:
            done = run_program(argv, timeout=self.settings.timeout)
        except ProgramTimeout as err:
            return ActOutcome(False, f"{what}: {err}")
        except OSError as err:
            return ActOutcome(False, f"{what}: cannot run {argv[0]}: {err.strerror}")
        if done.returncode == 0:
            return ActOutcome(True, f"{what}: {command} exited 0")
        return ActOutcome(False, f"{what}: {command} exited {done.returncode}: {done.tail()}")


@dataclass(frozen=True)
class RebootRecord:
    """A reboot this node was ordered: the command, when, and the boot it ended."""

    id: str
    time_seconds: float
    boot_id: str | None


class RebootLedger:
    """The last :attr:`KEEP` reboot commands carried out, in ``state_dir/reboots.json``."""

    FILE = "reboots.json"
    KEEP = 16

    def __init__(self, state_dir: Path, procfs: Path) -> None:
        self._path = state_dir / self.FILE
        self._boot_id_path = procfs / "sys" / "kernel" / "random" / "boot_id"

    def boot_id(self) -> str | None:
        """The kernel's id of this boot (None where /proc does not have it)."""
        try:
            return self._boot_id_path.read_text(encoding="ascii").strip() or None
        except (OSError, UnicodeDecodeError):
            return None

    def _load(self) -> list[RebootRecord]:
        try:
            raw = json.loads(self._path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as err:
            log.warning("cannot read %s (%s): earlier reboots forgotten", self._path, err)
            return []
        records = []
        for item in raw if isinstance(raw, list) else []:
            if isinstance(item, dict) and isinstance(item.get("id"), str):
                boot = item.get("boot_id")
                records.append(RebootRecord(item["id"], float(item.get("time_seconds", 0.0)),
                                            boot if isinstance(boot, str) else None))
        return records

    def find(self, command_id: str) -> RebootRecord | None:
        """The record of an earlier reboot for ``command_id``."""
        return next((r for r in self._load() if r.id == command_id), None)

    def record(self, command_id: str, time_seconds: float) -> None:
        """Write the reboot down (synced to disk) before it runs; raises OSError."""
        records = [r for r in self._load() if r.id != command_id]
        records.append(RebootRecord(command_id, time_seconds, self.boot_id()))
        body = json.dumps([r.__dict__ for r in records[-self.KEEP:]], indent=1)
        temporary = self._path.with_suffix(".tmp")
        with temporary.open("w", encoding="utf-8") as out:
            out.write(body)
            out.flush()
            os.fsync(out.fileno())
        temporary.replace(self._path)
