"""MIG on a simulated GPU: the instance profiles of an H100, and the instances made of them.

A GPU with MIG profiles (:attr:`GpuProfile.mig_profiles
<sn_monitor.sim.gpu_model.GpuProfile.mig_profiles>`) holds one :class:`MigState`: the MIG
mode (current and pending) and up to :data:`MAX_MIG_DEVICES` slots, each empty or holding
one :class:`MigInstance` (a GPU instance with one compute instance: one MIG device, as
``nvidia-smi mig -cgi <profiles> -C`` makes them). The fake NVML answers from it with
NVML's semantics: ``nvmlDeviceGetMigDeviceHandleByIndex`` is NotFound on an empty slot,
and the parent's utilization is NotSupported while the mode is on.

A simulation or a test drives it: :meth:`MigState.enable`, :meth:`MigState.create`,
:meth:`MigState.destroy` (leaves its slot empty), :meth:`MigInstance.set_processes` and
:meth:`MigInstance.set_load`. Imports nothing of the simulator; the GPU model steps it.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field

MIB = 1024**2
#: The MIG devices an H100 or A100 can hold at once (``nvmlDeviceGetMaxMigDeviceCount``).
MAX_MIG_DEVICES = 7
#: An H100's compute (SM) slices and memory slices, what the profiles divide.
COMPUTE_SLICES = 7
MEMORY_SLICES = 8


@dataclass(frozen=True, slots=True)
class MigProfile:
    """A GPU instance profile: its name, slices, memory and the ids its instances get.

    ``gpu_instance_ids``: the GPU instance ids the driver hands out for this profile, in
    placement order (one per instance the GPU can hold).
    """

    name: str
    compute_slices: int
    memory_slices: int
    memory_bytes: int
    gpu_instance_ids: tuple[int, ...]


#: The profiles of an H100 80GB as ``nvidia-smi mig -lgip`` lists them (memory in MiB:
#: 9.75, 19.62, 39.50 and 79.25 GiB), with the instance ids a GPU gets when it is cut
#: into instances of one profile.
H100_MIG_PROFILES: tuple[MigProfile, ...] = (
    MigProfile("1g.10gb", 1, 1, 9984 * MIB, (7, 8, 9, 10, 11, 12, 13)),
    MigProfile("1g.20gb", 1, 2, 20096 * MIB, (3, 4, 5, 6)),
    MigProfile("2g.20gb", 2, 2, 20096 * MIB, (3, 4, 5)),
    MigProfile("3g.40gb", 3, 4, 40448 * MIB, (1, 2)),
    MigProfile("4g.40gb", 4, 4, 40448 * MIB, (1,)),
    MigProfile("7g.80gb", 7, 8, 81152 * MIB, (0,)),
)


class MigError(ValueError):
    """A MIG request the driver would refuse (mode off, no room, no such instance)."""


@dataclass(frozen=True, slots=True)
class MigGpmSnapshot:
    """A GPU instance's activity integrals at one instant, what a GPM MIG sample holds."""

    elapsed_seconds: float
    sm_active_seconds: float
    dram_active_seconds: float
    pcie_rx_bytes: float = 0.0
    pcie_tx_bytes: float = 0.0


@dataclass(slots=True)
class MigInstance:
    """One MIG device: a GPU instance of ``profile`` with compute instance 0.

    ``processes``: (pid, used memory bytes), as on a whole GPU; ``load``: the fraction
    of the instance's SMs its work keeps busy (DRAM at three quarters of it).
    """

    profile: MigProfile
    gpu_instance_id: int
    uuid: str
    compute_instance_id: int = 0
    processes: list[tuple[int, int]] = field(default_factory=list)
    load: float = 0.0
    _elapsed: float = 0.0
    _sm_active: float = 0.0
    _dram_active: float = 0.0

    @property
    def memory_used_bytes(self) -> int:
        """What its processes hold, up to the instance's memory."""
        return min(self.profile.memory_bytes, sum(used for _, used in self.processes))

    def set_processes(self, processes: Iterable[tuple[int, int]]) -> None:
        """The compute processes NVML lists on this MIG device: (pid, used memory bytes)."""
        listed = list(processes)
        if any(pid <= 0 or used < 0 for pid, used in listed):
            raise MigError("a process needs a pid > 0 and used memory >= 0")
        self.processes = listed

    def set_load(self, load: float) -> None:
        """Hold the instance's SM activity at ``load`` (0..1)."""
        self.load = min(1.0, max(0.0, load))

    def advance(self, dt_seconds: float) -> None:
        self._elapsed += dt_seconds
        self._sm_active += self.load * dt_seconds
        self._dram_active += 0.75 * self.load * dt_seconds

    def gpm_snapshot(self) -> MigGpmSnapshot:
        return MigGpmSnapshot(self._elapsed, self._sm_active, self._dram_active)


class MigState:
    """A GPU's MIG mode and MIG device slots; ``profiles`` empty: a GPU without MIG.

    ``parent_uuid`` seeds the MIG devices' UUIDs, so a run is reproducible.
    """

    def __init__(self, profiles: tuple[MigProfile, ...], parent_uuid: str) -> None:
        self.profiles = {profile.name: profile for profile in profiles}
        self._parent_uuid = parent_uuid
        self.enabled = False
        self.pending = False
        self.slots: list[MigInstance | None] = []

    @property
    def supported(self) -> bool:
        return bool(self.profiles)

    @property
    def instances(self) -> list[MigInstance]:
        """The MIG devices, in slot order."""
        return [instance for instance in self.slots if instance is not None]

    def enable(self) -> None:
        """MIG mode on, now and pending (as after the GPU reset that applies it)."""
        if not self.supported:
            raise MigError("this GPU has no MIG")
        self.enabled = self.pending = True
        self.slots = [None] * MAX_MIG_DEVICES

    def disable(self) -> None:
        """MIG mode off, its instances gone."""
        self.enabled = self.pending = False
        self.slots = []

    def create(self, profile_names: Iterable[str]) -> list[MigInstance]:
        """One GPU instance (with its compute instance) per name, in the first free slots."""
        if not self.enabled:
            raise MigError("MIG mode is off")
        made = []
        for name in profile_names:
            profile = self.profiles.get(name)
            if profile is None:
                raise MigError(f"no MIG profile {name!r} (have {sorted(self.profiles)})")
            made.append(self._place(profile))
        return made

    def destroy(self, gpu_instance_id: int) -> None:
        """Destroy a GPU instance: its slot is empty from now on."""
        self.slots[self.slots.index(self.instance(gpu_instance_id))] = None

    def instance(self, gpu_instance_id: int) -> MigInstance:
        for instance in self.instances:
            if instance.gpu_instance_id == gpu_instance_id:
                return instance
        raise MigError(f"no GPU instance {gpu_instance_id}")

    def advance(self, dt_seconds: float) -> None:
        for instance in self.instances:
            instance.advance(dt_seconds)

    def _place(self, profile: MigProfile) -> MigInstance:
        used = self.instances
        if sum(i.profile.compute_slices for i in used) + profile.compute_slices > COMPUTE_SLICES:
            raise MigError(f"no compute slices left for {profile.name}")
        if sum(i.profile.memory_slices for i in used) + profile.memory_slices > MEMORY_SLICES:
            raise MigError(f"no memory slices left for {profile.name}")
        taken = {i.gpu_instance_id for i in used}
        free_ids = [gi for gi in profile.gpu_instance_ids if gi not in taken]
        if not free_ids or None not in self.slots:
            raise MigError(f"no placement left for {profile.name}")
        rng = random.Random(f"{self._parent_uuid}/mig/{free_ids[0]}")
        instance = MigInstance(profile, free_ids[0],
                               f"MIG-{uuid.UUID(int=rng.getrandbits(128), version=4)}")
        self.slots[self.slots.index(None)] = instance
        return instance
