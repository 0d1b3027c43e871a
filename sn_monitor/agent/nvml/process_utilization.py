"""Each compute process's SM utilisation, from ``nvmlDeviceGetProcessUtilization``.

NVML keeps a buffer of per-process samples (percent of the sample's period each process
had a kernel on the SMs) and returns those newer than the timestamp it is given: the
reader passes the newest it has seen on that GPU (:attr:`Device.process_samples_seen
<sn_monitor.agent.nvml.device.Device.process_samples_seen>`), and keeps each pid's
latest sample. ``NotFound`` means no sample is newer (no process ran a kernel since):
no value, and not an error. Every other error goes through the adapter's one
classification (:meth:`~sn_monitor.agent.nvml.calls.DriverCalls.classify`): not
supported (vGPU, MIG without privileges) remembered per GPU and never asked again, a
fault ending the GPU's read, anything else logged once. Imports :mod:`.calls`,
:mod:`.device`, :mod:`.errors` and :mod:`.units`.
"""

from __future__ import annotations

from sn_monitor.agent.nvml.calls import DriverCalls
from sn_monitor.agent.nvml.device import Device
from sn_monitor.agent.nvml.errors import NOT_FOUND, SUCCESS, error_code
from sn_monitor.agent.nvml.units import percent

FUNCTION = "nvmlDeviceGetProcessUtilization"
KEY = "process_utilization"
# NotFound: no sample newer than the timestamp. pynvml raises NVMLError(SUCCESS) when
# the driver answers the size query with success and no samples: the same thing.
_NO_SAMPLES = frozenset({NOT_FOUND, SUCCESS})


class ProcessUtilization:
    """Reads one GPU's per-process SM utilisation through ``calls``."""

    def __init__(self, calls: DriverCalls) -> None:
        self._calls = calls

    def sm_ratios(self, device: Device) -> dict[int, float]:
        """Each pid's SM utilisation (0..1) in its latest new sample; {} if none or absent.

        Raises :class:`~sn_monitor.agent.nvml.errors.DeviceFault` on a fault.
        """
        calls = self._calls
        if calls.known_absent(device, KEY, FUNCTION):
            return {}
        fn = getattr(calls.nvml, FUNCTION, None)
        if fn is None:
            calls.function_missing(FUNCTION)
            return {}
        try:
            samples = fn(device.handle, device.process_samples_seen)
        except calls.nvml.NVMLError as error:
            if error_code(error) not in _NO_SAMPLES:
                calls.classify(device, KEY, FUNCTION, error)  # a fault raises here
            return {}
        latest: dict[int, tuple[int, float]] = {}
        for sample in samples:
            stamp, ratio = int(sample.timeStamp), percent(sample.smUtil)
            if ratio is None:
                continue
            seen = latest.get(int(sample.pid))
            if seen is None or stamp >= seen[0]:
                latest[int(sample.pid)] = (stamp, ratio)
        if latest:
            device.process_samples_seen = max(
                device.process_samples_seen, *(stamp for stamp, _ in latest.values())
            )
        return {pid: ratio for pid, (_, ratio) in latest.items()}
