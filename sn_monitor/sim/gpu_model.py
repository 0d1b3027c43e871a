"""Simulated GPU physics and faults, behind the fake NVML.

A :class:`SimulatedGpu` is a small lumped model of one data-centre GPU: load drives power,
power (capped by the power limit) drives temperature through a first-order thermal
model, temperature near the slowdown threshold pulls the clocks down. Time moves only
when the simulation driver calls :meth:`SimulatedGpu.step`; noise comes from a seeded
:class:`random.Random`, so a run is reproducible. Fault injectors (cooling failure, XID,
ECC, row remap, NVLink, PCIe, falling off the bus) change state that the fake NVML
reports the way the real driver would. The fail-slow faults (clocks held low, an NVLink
error storm, a noisy neighbour) set :class:`FailSlowState` through
:mod:`sn_monitor.sim.gpu_fail_slow`; the model reads it as it steps.

Values are kept in base units (watts, celsius, bytes/s, hertz as MHz integers where NVML
reports MHz); :mod:`sn_monitor.sim.fake_nvml` converts them to NVML's units.
"""

from __future__ import annotations

import math
import random
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from sn_monitor.sim.mig import H100_MIG_PROFILES, MigProfile, MigState

GIB = 1024**3

# NVML clocks-event-reason bits (nvml.h, identical for the older "throttle" names).
REASON_GPU_IDLE = 0x1
REASON_SW_POWER_CAP = 0x4
REASON_HW_SLOWDOWN = 0x8
REASON_SW_THERMAL_SLOWDOWN = 0x20
REASON_HW_THERMAL_SLOWDOWN = 0x40
REASON_HW_POWER_BRAKE_SLOWDOWN = 0x80
XID_FALLEN_OFF_BUS = 79

# NVML's GPU fabric states (nvml.h NVML_GPU_FABRIC_STATE_*) and return codes.
FABRIC_NOT_STARTED = 1
FABRIC_IN_PROGRESS = 2
FABRIC_COMPLETED = 3
NVML_SUCCESS = 0

# The share of NVLink bandwidth a training step's collectives use at full load.
_NVLINK_TRAINING_SHARE = 0.35

# PCIe payload bandwidth per lane, bytes/s, by generation (after line encoding).
_PCIE_LANE_BYTES_PER_SECOND = {1: 250e6, 2: 500e6, 3: 985e6, 4: 1969e6, 5: 3938e6, 6: 7563e6}


@dataclass(frozen=True, slots=True)
class GpuProfile:
    """What kind of GPU is simulated: limits, thresholds and what its driver supports.

    ``unsupported`` names fake-NVML functions that answer NotSupported on this GPU
    (e.g. ``"nvmlDeviceGetPcieReplayCounter"``). ``gpm_supported`` and
    ``memory_temperature_supported`` model the two capabilities that differ between
    Ampere and Hopper: GPM metrics and the HBM temperature field.
    ``nvlink_totals_supported=False`` makes the GPU-wide NVLink error-total field values
    answer NotSupported (as an older driver might), leaving only the per-link counters.
    ``fabric_supported=False``: the GPU fabric calls answer NotSupported (before Hopper).
    ``mig_profiles``: the MIG instance profiles the GPU can be cut into; none: no MIG
    (the MIG calls answer NotSupported).
    """

    name: str
    memory_total_bytes: int
    power_default_limit_watts: float = 700.0
    power_min_limit_watts: float = 200.0
    power_max_limit_watts: float = 700.0
    full_load_power_watts: float = 700.0
    idle_power_watts: float = 70.0
    shutdown_celsius: float = 92.0
    slowdown_celsius: float = 89.0
    gpu_max_celsius: float = 87.0
    memory_max_celsius: float = 95.0
    ambient_celsius: float = 30.0
    # 650 W at ambient 30 °C settles at 70 °C: R = 40 / 650 °C per watt.
    thermal_resistance_celsius_per_watt: float = 40.0 / 650.0
    thermal_time_constant_seconds: float = 30.0
    hbm_offset_celsius: float = 4.0
    sm_max_clock_mhz: int = 1980
    sm_idle_clock_mhz: int = 345
    memory_clock_mhz: int = 2619
    pcie_generation: int = 5
    pcie_width: int = 16
    nvlink_count: int = 18
    #: Each NVLink's data rate per direction (NVLink 3 and 4: 25 GB/s).
    nvlink_link_bytes_per_second: float = 25e9
    vbios_version: str = "96.00.89.00.01"
    gpm_supported: bool = True
    memory_temperature_supported: bool = True
    nvlink_totals_supported: bool = True
    fabric_supported: bool = True
    unsupported: frozenset[str] = frozenset()
    mig_profiles: tuple[MigProfile, ...] = ()


H100_SXM = GpuProfile(name="NVIDIA H100 80GB HBM3", memory_total_bytes=80 * GIB,
                      mig_profiles=H100_MIG_PROFILES)

H200_SXM = GpuProfile(
    name="NVIDIA H200",
    memory_total_bytes=141 * 10**9,
    memory_clock_mhz=3201,
    vbios_version="96.00.A5.00.01",
)

A100_SXM = GpuProfile(
    name="NVIDIA A100-SXM4-80GB",
    memory_total_bytes=80 * GIB,
    power_default_limit_watts=400.0,
    power_min_limit_watts=100.0,
    power_max_limit_watts=400.0,
    full_load_power_watts=400.0,
    idle_power_watts=55.0,
    shutdown_celsius=92.0,
    slowdown_celsius=89.0,
    gpu_max_celsius=87.0,
    memory_max_celsius=95.0,
    # 380 W settles at 70 °C, as on the H100 profile.
    thermal_resistance_celsius_per_watt=40.0 / 380.0,
    sm_max_clock_mhz=1410,
    sm_idle_clock_mhz=210,
    memory_clock_mhz=1593,
    pcie_generation=4,
    nvlink_count=12,
    vbios_version="92.00.45.00.06",
    gpm_supported=False,
    memory_temperature_supported=False,
    fabric_supported=False,
)

# The bus numbers of the eight GPUs of an HGX H100 baseboard, in NVML index order.
HGX_BUS_NUMBERS = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)


@dataclass(slots=True)
class NvLinkState:
    """One NVLink's state and cumulative error counters."""

    up: bool = True
    crc_flit_errors: int = 0
    crc_data_errors: int = 0
    replay_errors: int = 0
    recovery_errors: int = 0
    #: Data sent and received over the link since power-on (NVML counts it in KiB).
    transmitted_bytes: float = 0.0
    received_bytes: float = 0.0


def training_load(elapsed_seconds: float, rng: random.Random) -> float:
    """A data-parallel training step pattern: busy, an all-reduce dip, a checkpoint stall.

    ~0.92 busy with small noise; every 30 s a 2 s all-reduce at ~0.5; every 600 s a 20 s
    checkpoint at ~0.1.
    """
    if elapsed_seconds % 600.0 >= 580.0:
        base = 0.1
    elif elapsed_seconds % 30.0 >= 28.0:
        base = 0.5
    else:
        base = 0.92
    return min(1.0, max(0.0, base + rng.gauss(0.0, 0.02)))


@dataclass(slots=True)
class FailSlowState:
    """What the fail-slow faults hold on a GPU (all at rest: a healthy GPU).

    ``nvlink_bandwidth_ratio``: the share of its peers' NVLink data rate the GPU moves
    (the NVLink data counters scale by it); ``neighbour_share``: how much of the GPU
    another tenant's process takes (the simulated job's rank slows by it).
    """

    clock_ratio: float = 1.0
    reasons: int = 0
    nvlink_errors_per_second: float = 0.0
    nvlink_bandwidth_ratio: float = 1.0
    neighbour_share: float = 0.0


#: Share of the SMs' busy time the simulated tensor pipes are busy (GPM ANY_TENSOR_UTIL).
TENSOR_SHARE = 0.6


@dataclass(slots=True)
class _Counters:
    """Integrals since power-on, for GPM-style "between two samples" metrics."""

    elapsed_seconds: float = 0.0
    sm_active_seconds: float = 0.0
    dram_active_seconds: float = 0.0
    pcie_rx_bytes: float = 0.0
    pcie_tx_bytes: float = 0.0
    tensor_active_seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class GpmSnapshot:
    """The integrals at one instant, what a GPM sample holds."""

    elapsed_seconds: float
    sm_active_seconds: float
    dram_active_seconds: float
    pcie_rx_bytes: float = 0.0
    pcie_tx_bytes: float = 0.0
    tensor_active_seconds: float = 0.0


class SimulatedGpu:
    """One simulated GPU; advance it with :meth:`step`, break it with the ``inject_*`` methods.

    All public methods take the GPU's lock, so a simulation driver and NVML readers may
    use it from different threads.
    """

    MAX_SUBSTEP = 1.0

    def __init__(
        self,
        index: int,
        profile: GpuProfile = H100_SXM,
        *,
        seed: int = 0,
        pci_bus_id: str | None = None,
        uuid_text: str | None = None,
        serial: str | None = None,
    ) -> None:
        self.lock = threading.RLock()
        self.index = index
        self.profile = profile
        self._rng = random.Random(f"{seed}/{index}")
        bus = HGX_BUS_NUMBERS[index] if index < len(HGX_BUS_NUMBERS) else (0x10 + index) % 0x100
        self.pci_bus_id = pci_bus_id or f"00000000:{bus:02X}:00.0"
        self.uuid = uuid_text or f"GPU-{uuid.UUID(int=self._rng.getrandbits(128), version=4)}"
        self.serial = serial or f"16523220{self._rng.randrange(10**5):05d}"
        #: NVML's minor number (``/dev/nvidia<minor>``); the index unless a test says not.
        self.minor_number = index
        self.load_function: Callable[[float, random.Random], float] = training_load
        self._load_override: float | None = None
        self.power_limit_watts = profile.power_default_limit_watts
        self.cooling_factor = 1.0
        self.lost = False
        self.utilization = 0.0
        self.power_watts = profile.idle_power_watts
        self.temperature_celsius = profile.ambient_celsius + (
            profile.thermal_resistance_celsius_per_watt * profile.idle_power_watts
        )
        self.sm_clock_mhz = profile.sm_idle_clock_mhz
        self.memory_clock_mhz = profile.memory_clock_mhz
        self.clock_event_reasons = REASON_GPU_IDLE
        self.energy_millijoules = 0.0
        self.memory_used_bytes = int(0.01 * profile.memory_total_bytes)
        self.dram_utilization = 0.0
        self.pcie_rx_bytes_per_second = 0.0
        self.pcie_tx_bytes_per_second = 0.0
        self.pcie_generation = profile.pcie_generation
        self.pcie_width = profile.pcie_width
        self.pcie_replays = 0
        self.ecc_corrected = 0
        self.ecc_uncorrected = 0
        self.remapped_rows_correctable = 0
        self.remapped_rows_uncorrectable = 0
        self.row_remap_pending = False
        self.row_remap_failed = False
        self.nvlinks = [NvLinkState() for _ in range(profile.nvlink_count)]
        self.xid_log: list[int] = []
        self._xid_listeners: list[Callable[[], None]] = []
        # The NVLink fabric: registered with Fabric Manager, as on a healthy HGX node.
        self.fabric_state = FABRIC_COMPLETED
        self.fabric_status = NVML_SUCCESS
        self.fabric_clique_id = 0
        self.fabric_cluster_uuid = bytes(16)
        #: Wall seconds per simulated second, for the traffic counters (see _advance_nvlinks).
        self.traffic_scale = 1.0
        #: Compute processes on the GPU: (pid, used memory bytes).
        self.processes: list[tuple[int, int]] = []
        self.fail_slow = FailSlowState()
        self._counters = _Counters()
        #: MIG mode and instances (:mod:`sn_monitor.sim.mig`); off until enabled.
        self.mig = MigState(profile.mig_profiles, self.uuid)

    # ---------------------------------------------------------------- derived values

    @property
    def memory_temperature_celsius(self) -> float:
        """HBM runs a few degrees above the core, more when the memory is busy."""
        return self.temperature_celsius + self.profile.hbm_offset_celsius * (
            0.5 + self.dram_utilization
        )

    @property
    def memory_utilization(self) -> float:
        """NVML's utilization.memory: the fraction of time memory was read or written."""
        return min(1.0, self.utilization * 0.6)

    @property
    def elapsed_seconds(self) -> float:
        return self._counters.elapsed_seconds

    def gpm_snapshot(self) -> GpmSnapshot:
        """The activity integrals now; GPM metrics are differences of two of these."""
        with self.lock:
            c = self._counters
            return GpmSnapshot(
                c.elapsed_seconds,
                c.sm_active_seconds,
                c.dram_active_seconds,
                c.pcie_rx_bytes,
                c.pcie_tx_bytes,
                c.tensor_active_seconds,
            )

    # ---------------------------------------------------------------- load

    def set_load(self, utilization: float | None) -> None:
        """Hold utilization at a fixed 0..1 value; None returns to the load function."""
        with self.lock:
            self._load_override = None if utilization is None else min(1.0, max(0.0, utilization))

    # ---------------------------------------------------------------- physics

    def step(self, dt_seconds: float) -> None:
        """Advance the model by ``dt_seconds``, in sub-steps of at most :attr:`MAX_SUBSTEP`.

        Each sub-step integrates temperature exactly (``exp(-dt/tau)``), so it is stable
        for any size; the sub-steps keep the clock/power feedback from lagging a long step.
        """
        if dt_seconds < 0:
            raise ValueError("time does not go backwards")
        with self.lock:
            remaining = dt_seconds
            while remaining > 1e-12 and not self.lost:
                substep = min(remaining, self.MAX_SUBSTEP)
                self._substep(substep)
                remaining -= substep

    def _substep(self, dt_seconds: float) -> None:
        p = self.profile
        target = self._load_override
        if target is None:
            target = self.load_function(self._counters.elapsed_seconds, self._rng)
        self.utilization = min(1.0, max(0.0, target))
        reasons = self.fail_slow.reasons
        clock_factor = self._thermal_clock_factor()
        if clock_factor < 1.0:
            reasons |= REASON_SW_THERMAL_SLOWDOWN
        clock_factor *= self.fail_slow.clock_ratio
        if self.temperature_celsius >= p.slowdown_celsius:
            reasons |= REASON_HW_THERMAL_SLOWDOWN | REASON_HW_SLOWDOWN
        dynamic = self.utilization * (p.full_load_power_watts - p.idle_power_watts)
        demand = p.idle_power_watts + dynamic * clock_factor
        if demand > self.power_limit_watts:
            headroom = max(0.0, self.power_limit_watts - p.idle_power_watts)
            clock_factor *= headroom / max(1e-9, demand - p.idle_power_watts)
            demand = self.power_limit_watts
            reasons |= REASON_SW_POWER_CAP
        self.power_watts = min(self.power_limit_watts, demand * (1.0 + self._rng.gauss(0.0, 0.005)))
        if self.utilization < 0.05:
            reasons |= REASON_GPU_IDLE
            self.sm_clock_mhz = p.sm_idle_clock_mhz
        else:
            self.sm_clock_mhz = max(p.sm_idle_clock_mhz, round(p.sm_max_clock_mhz * clock_factor))
        self.clock_event_reasons = reasons
        self._advance_temperature(dt_seconds)
        self.energy_millijoules += self.power_watts * dt_seconds * 1000.0
        self.dram_utilization = min(1.0, self.utilization * 0.75 * min(1.0, clock_factor))
        self.memory_used_bytes = int(p.memory_total_bytes * (0.02 + 0.85 * self.utilization))
        link = self._pcie_link_bytes_per_second()
        self.pcie_rx_bytes_per_second = link * 0.20 * self.utilization
        self.pcie_tx_bytes_per_second = link * 0.08 * self.utilization
        c = self._counters
        c.elapsed_seconds += dt_seconds
        c.sm_active_seconds += self.utilization * min(1.0, clock_factor) * dt_seconds
        c.dram_active_seconds += self.dram_utilization * dt_seconds
        # a training step is mostly matrix multiplies: the tensor pipes busy most of the SMs' time
        c.tensor_active_seconds += (TENSOR_SHARE * self.utilization * min(1.0, clock_factor)
                                    * dt_seconds)
        c.pcie_rx_bytes += self.pcie_rx_bytes_per_second * dt_seconds
        c.pcie_tx_bytes += self.pcie_tx_bytes_per_second * dt_seconds
        self._advance_nvlinks(dt_seconds)
        self._advance_nvlink_errors(dt_seconds)
        self.mig.advance(dt_seconds)
        if self.temperature_celsius >= p.shutdown_celsius:
            # The driver's thermal shutdown: the GPU drops off the bus.
            self._fall_off_bus()

    def _advance_nvlinks(self, dt_seconds: float) -> None:
        """Collectives move data over every link that is up, in step with the GPU's load.

        ``traffic_scale``: wall seconds per simulated second when the simulation runs
        faster than the wall clock (throughput is measured per wall second).
        """
        moved = (self.profile.nvlink_link_bytes_per_second * _NVLINK_TRAINING_SHARE
                 * self.utilization * self.fail_slow.nvlink_bandwidth_ratio * dt_seconds
                 * self.traffic_scale)
        for link in self.nvlinks:
            if link.up:
                link.transmitted_bytes += moved
                link.received_bytes += moved

    def _thermal_clock_factor(self) -> float:
        """1.0 below the max operating temperature, falling 10 % per degree above it."""
        p = self.profile
        over = self.temperature_celsius - p.gpu_max_celsius
        factor = 1.0 if over <= 0 else max(0.3, 1.0 - 0.1 * over)
        if self.temperature_celsius >= p.slowdown_celsius:
            factor = min(factor, 0.5)
        return factor

    def _advance_temperature(self, dt_seconds: float) -> None:
        p = self.profile
        resistance = p.thermal_resistance_celsius_per_watt * self.cooling_factor
        target = p.ambient_celsius + resistance * self.power_watts
        decay = math.exp(-dt_seconds / p.thermal_time_constant_seconds)
        self.temperature_celsius = target + (self.temperature_celsius - target) * decay

    def _pcie_link_bytes_per_second(self) -> float:
        lane = _PCIE_LANE_BYTES_PER_SECOND.get(self.pcie_generation, 3938e6)
        return lane * self.pcie_width

    def _advance_nvlink_errors(self, dt_seconds: float) -> None:
        """An NVLink error storm (``nvlink-slow``): replays, CRC errors, recoveries.

        The errors land on a link that is still up; a recovery now and then.
        """
        rate = self.fail_slow.nvlink_errors_per_second
        if rate <= 0:
            return
        links = [link for link in self.nvlinks if link.up] or self.nvlinks
        link = links[self._rng.randrange(len(links))]
        replays = int(rate * dt_seconds * self._rng.uniform(0.5, 1.5))
        link.replay_errors += replays
        link.crc_flit_errors += replays * 3
        if self._rng.random() < 0.05 * dt_seconds:
            link.recovery_errors += 1

    # ---------------------------------------------------------------- power limit

    def set_power_limit_watts(self, watts: float) -> float:
        """Set the power cap, clamped to the profile's constraints; returns what was set."""
        with self.lock:
            p = self.profile
            self.power_limit_watts = min(
                p.power_max_limit_watts, max(p.power_min_limit_watts, watts)
            )
            return self.power_limit_watts

    # ---------------------------------------------------------------- faults

    def inject_cooling_failure(self, factor: float = 1.6) -> None:
        """Multiply the thermal resistance (a failed fan or blocked airflow)."""
        if factor <= 0:
            raise ValueError("cooling factor must be positive")
        with self.lock:
            self.cooling_factor = factor

    def clear_cooling_failure(self) -> None:
        with self.lock:
            self.cooling_factor = 1.0

    def inject_xid(self, code: int) -> None:
        """Queue an XID critical-error event; repeats of one code are separate events."""
        with self.lock:
            self._queue_xid(code)

    def listen_xids(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` (once per listener, however often given) after each XID queued.

        The fake NVML's event wait blocks until then. It is called under the GPU's lock,
        so it must take no lock of its own that is held while this GPU's is taken.
        """
        with self.lock:
            if listener not in self._xid_listeners:
                self._xid_listeners.append(listener)

    def _queue_xid(self, code: int) -> None:
        self.xid_log.append(code)
        for listener in self._xid_listeners:
            listener()

    def inject_ecc_corrected(self, count: int = 1) -> None:
        with self.lock:
            self.ecc_corrected += count

    def inject_ecc_uncorrectable(self, count: int = 1) -> None:
        """Count uncorrectable ECC errors; HBM then has a row remap pending until reset.

        No XID is queued: inject the one the scenario wants (94, 95, 48) explicitly.
        """
        with self.lock:
            self.ecc_uncorrected += count
            self.row_remap_pending = True

    def inject_row_remap_pending(self) -> None:
        with self.lock:
            self.row_remap_pending = True

    def inject_row_remap_failure(self) -> None:
        with self.lock:
            self.row_remap_failed = True

    def reset(self) -> None:
        """A GPU reset: remaps apply, ECC restarts, NVLinks retrain, the GPU is back.

        Pending row remaps take effect, the volatile ECC counters start again. XIDs
        already queued stay delivered events (a reset does not unsay them); a downtrained
        PCIe link stays as it is (the slot or riser is at fault: see :meth:`power_cycle`).
        """
        with self.lock:
            if self.row_remap_pending:
                self.remapped_rows_uncorrectable += 1
                self.row_remap_pending = False
            self.ecc_corrected = 0
            self.ecc_uncorrected = 0
            for link in self.nvlinks:
                link.up = True
            self.lost = False

    def power_cycle(self) -> None:
        """The node rebooted: every process gone, the GPU reset, its PCIe link retrained."""
        with self.lock:
            self.processes = []
            self.reset()
            self.pcie_generation = self.profile.pcie_generation
            self.pcie_width = self.profile.pcie_width

    def inject_nvlink_errors(
        self,
        link: int,
        *,
        crc: int = 0,
        crc_data: int = 0,
        replay: int = 0,
        recovery: int = 0,
    ) -> None:
        """Add to one link's error counters (``crc`` counts flit CRC errors)."""
        with self.lock:
            state = self.nvlinks[link]
            state.crc_flit_errors += crc
            state.crc_data_errors += crc_data
            state.replay_errors += replay
            state.recovery_errors += recovery

    def set_nvlink_down(self, link: int) -> None:
        """The link drops; like real hardware it tries to recover: one recovery counted."""
        with self.lock:
            state = self.nvlinks[link]
            if state.up:
                state.recovery_errors += 1
            state.up = False

    def set_nvlink_up(self, link: int) -> None:
        with self.lock:
            self.nvlinks[link].up = True

    def inject_pcie_downgrade(self, generation: int, width: int) -> None:
        """The link retrained below its maximum speed or width."""
        with self.lock:
            self.pcie_generation = generation
            self.pcie_width = width

    def clear_pcie_downgrade(self) -> None:
        with self.lock:
            self.pcie_generation = self.profile.pcie_generation
            self.pcie_width = self.profile.pcie_width

    def inject_pcie_replays(self, count: int) -> None:
        with self.lock:
            self.pcie_replays += count

    def inject_fabric_not_ready(self, state: int = FABRIC_NOT_STARTED,
                                status: int = NVML_SUCCESS) -> None:
        """The fabric registration stops short, or completes with an error.

        Fabric Manager not running: ``NOT_STARTED``; ``status`` is an NVML return code.
        """
        if state not in (FABRIC_NOT_STARTED, FABRIC_IN_PROGRESS, FABRIC_COMPLETED):
            raise ValueError(f"fabric state must be 1, 2 or 3, got {state}")
        with self.lock:
            self.fabric_state = state
            self.fabric_status = status

    def clear_fabric(self) -> None:
        with self.lock:
            self.fabric_state = FABRIC_COMPLETED
            self.fabric_status = NVML_SUCCESS

    def set_processes(self, processes: list[tuple[int, int]]) -> None:
        """The compute processes NVML lists on this GPU: (pid, used memory bytes)."""
        if any(pid <= 0 or used < 0 for pid, used in processes):
            raise ValueError("a pid is positive and used memory not negative")
        with self.lock:
            self.processes = list(processes)

    def fall_off_bus(self) -> None:
        """Every NVML device call now fails with GpuIsLost; XID 79 is queued."""
        with self.lock:
            self._fall_off_bus()

    def _fall_off_bus(self) -> None:
        if not self.lost:
            self.lost = True
            self._queue_xid(XID_FALLEN_OFF_BUS)


def make_gpus(
    count: int = 8, profile: GpuProfile = H100_SXM, *, seed: int = 0
) -> list[SimulatedGpu]:
    """``count`` GPUs of one profile with HGX-like bus ids, deterministic for a seed."""
    return [SimulatedGpu(i, profile, seed=seed) for i in range(count)]
