"""Power: NVML power limits (read, set, always restore), a telemetry sampler, and a metadata snapshot.

Everything goes through an ``nvml`` object with pynvml's function names (the ``pynvml`` module of nvidia-ml-py
by default, imported on first use), so tests inject a double. NVML numbers GPUs in PCI order and ignores
``CUDA_VISIBLE_DEVICES``, so a torch device is mapped to its NVML handle by UUID. NVML reports power in
milliwatts and energy in millijoules; this module speaks watts and joules.

A limit set by ``PowerController.applied`` is restored on every exit path: normal exit, exception, Ctrl-C
(KeyboardInterrupt) and SIGTERM (turned into ``Terminated`` for the duration). While the original limit is being
written back, SIGINT and SIGTERM are held and acted on afterwards.
"""

from __future__ import annotations

import functools
import os
import signal
import statistics
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Self

from mxkernels.core.errors import InputError

# pynvml constants, used where the nvml object does not define them
_DEFAULTS = {
    "NVML_CLOCK_GRAPHICS": 0,
    "NVML_CLOCK_SM": 1,
    "NVML_CLOCK_MEM": 2,
    "NVML_TEMPERATURE_GPU": 0,
    "NVML_FI_DEV_POWER_INSTANT": 186,
    "NVML_ERROR_NOT_SUPPORTED": 3,
    "NVML_ERROR_NO_PERMISSION": 4,
}

CLOCK_EVENT_REASONS = {
    0x1: "GpuIdle",
    0x2: "ApplicationsClocksSetting",
    0x4: "SwPowerCap",
    0x8: "HwSlowdown",
    0x10: "SyncBoost",
    0x20: "SwThermalSlowdown",
    0x40: "HwThermalSlowdown",
    0x80: "HwPowerBrakeSlowdown",
    0x100: "DisplayClockSetting",
}
# Reasons that invalidate a measurement. SwPowerCap is the intended regime of a power-limit sweep: recorded only.
THROTTLING_MASK = 0x8 | 0x20 | 0x40 | 0x80


class PowerError(RuntimeError):
    """NVML is unavailable, or a power limit could not be read, set or restored."""


class PowerPermissionError(PowerError):
    """Setting a power limit is not permitted here (not root, NVML NoPermission, or not supported)."""


class Terminated(SystemExit):
    """SIGTERM arrived while a power limit was applied; raised so the limit is restored before the process exits
    (exit status 143, as for an unhandled SIGTERM)."""

    def __init__(self):
        super().__init__(128 + signal.SIGTERM)


@dataclass
class PowerLimits:
    """Power limits in watts: the requested setting, the default, the settable range, and what is enforced
    after every limiter (out-of-band ones included, so it can sit below the request)."""

    current_w: float
    default_w: float
    min_w: float
    max_w: float
    enforced_w: float


def _import_pynvml():
    import pynvml

    return pynvml


def _const(nvml: Any, name: str) -> int:
    return getattr(nvml, name, _DEFAULTS[name])


def _error_code(e: BaseException) -> int | None:
    return getattr(e, "value", None)


def _query(nvml: Any, name: str, *args) -> Any:
    """``nvml.<name>(*args)``, or None when ``nvml`` lacks the call or it fails; bytes come back as str.

    Metadata and telemetry take what the driver offers: a call missing on this driver or GPU is not an error.
    """
    fn = getattr(nvml, name, None)
    if fn is None:
        return None
    try:
        value = fn(*args)
    except Exception:  # noqa: BLE001 -- pynvml raises its own NVMLError per code: any failure means "not offered"
        return None
    return value.decode() if isinstance(value, bytes) else value


def _torch_uuid(device: int) -> str | None:
    """NVML's UUID ("GPU-...") of torch device ``device``, or None without CUDA."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        uuid = str(torch.cuda.get_device_properties(device).uuid)
    except Exception:  # noqa: BLE001 -- without a UUID the device is mapped by index instead
        return None
    return uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"


def _open(device: int, nvml: Any | None) -> tuple[Any, Any]:
    """(nvml, handle of torch device ``device``); raises ``PowerError`` when NVML is unavailable."""
    try:
        nvml = nvml if nvml is not None else _import_pynvml()
    except ImportError as e:
        raise PowerError(f"NVML is unavailable: nvidia-ml-py is not installed ({e})") from e
    try:
        nvml.nvmlInit()
        uuid = _torch_uuid(device)
        if uuid is None:  # no torch CUDA: NVML's own numbering is all there is
            return nvml, nvml.nvmlDeviceGetHandleByIndex(device)
        return nvml, nvml.nvmlDeviceGetHandleByUUID(uuid)
    except Exception as e:
        raise PowerError(f"NVML is unavailable for GPU {device}: {e}") from e


def _is_root() -> bool:
    return not hasattr(os, "geteuid") or os.geteuid() == 0


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


class _SignalGuard:
    """For the duration: SIGTERM raises ``Terminated``. ``holding()`` defers SIGINT and SIGTERM around a critical
    section and acts on them after it. A no-op outside the main thread, where Python cannot install handlers."""

    def __init__(self):
        self.active = _in_main_thread()
        self.previous_term = None

    def __enter__(self):
        if self.active:
            self.previous_term = signal.signal(signal.SIGTERM, self._raise_terminated)
        return self

    def __exit__(self, *exc):
        if self.active:
            signal.signal(signal.SIGTERM, self.previous_term)
        return False

    @staticmethod
    def _raise_terminated(signum, frame):
        raise Terminated()

    @contextmanager
    def holding(self) -> Iterator[None]:
        if not self.active:
            yield
            return
        pending: list[int] = []
        held = (signal.SIGINT, signal.SIGTERM)
        previous = {s: signal.signal(s, lambda signum, frame: pending.append(signum)) for s in held}
        try:
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            for s in dict.fromkeys(pending):
                signal.raise_signal(s)


class PowerController:
    """Reads and sets the power limit of torch device ``device`` through ``nvml`` (pynvml by default).

    Raises ``PowerError`` when NVML is unavailable. ``settle_timeout_s`` / ``poll_s``: how long ``applied`` waits,
    and how often it looks, for the enforced limit to read back the requested one.
    """

    def __init__(
        self, device: int = 0, nvml: Any | None = None, *, settle_timeout_s: float = 5.0, poll_s: float = 0.05
    ):
        self.device = device
        self.settle_timeout_s = settle_timeout_s
        self.poll_s = poll_s
        self._nvml, self._handle = _open(device, nvml)

    def read_limits(self) -> PowerLimits:
        n, h = self._nvml, self._handle
        lo, hi = n.nvmlDeviceGetPowerManagementLimitConstraints(h)
        return PowerLimits(
            current_w=n.nvmlDeviceGetPowerManagementLimit(h) / 1000,
            default_w=n.nvmlDeviceGetPowerManagementDefaultLimit(h) / 1000,
            min_w=lo / 1000,
            max_w=hi / 1000,
            enforced_w=n.nvmlDeviceGetEnforcedPowerLimit(h) / 1000,
        )

    def resolve(self, percents=None, watts=None) -> list[float | None]:
        """Limits in watts from ``percents`` (of the default limit) or ``watts``, each checked against the card's
        settable range. Neither given (or empty): ``[None]``, the limit as found, never touched."""
        if percents and watts:
            raise InputError("give power limits as percents or as watts, not both")
        if not percents and not watts:
            return [None]
        limits = self.read_limits()
        if percents:
            if any(not p > 0 for p in percents):
                raise InputError(f"percents must be positive, got {list(percents)}")
            resolved = [limits.default_w * p / 100 for p in percents]
            described = [f"{p:g}% of the default {limits.default_w:g} W = {w:g} W" for p, w in zip(percents, resolved)]
            name = "percents"
        else:
            resolved = [float(w) for w in watts]
            described = [f"{w:g} W" for w in resolved]
            name = "watts"
        for w, text in zip(resolved, described):
            if not limits.min_w <= w <= limits.max_w:
                raise InputError(
                    f"{name}: {text} is outside this card's power-limit range [{limits.min_w:g}, {limits.max_w:g}] W"
                )
        return resolved

    def check_permission(self, watts: float | None) -> None:
        """Raise ``PowerPermissionError`` unless the limit can be set here; nothing is changed (the current
        setting is written back to itself, which is what NVML's permission check needs). None: nothing to check."""
        if watts is None:
            return
        found = self._nvml.nvmlDeviceGetPowerManagementLimit(self._handle)
        hint = f"omit power limits to measure at the limit as found ({found / 1000:g} W)"
        if not _is_root():
            raise PowerPermissionError(f"setting a GPU power limit needs root (or CAP_SYS_ADMIN); {hint}")
        try:
            self._nvml.nvmlDeviceSetPowerManagementLimit(self._handle, found)
        except Exception as e:
            code = _error_code(e)
            if code == _const(self._nvml, "NVML_ERROR_NO_PERMISSION"):
                raise PowerPermissionError(f"NVML refused to set the power limit (NoPermission: {e}); {hint}") from e
            if code == _const(self._nvml, "NVML_ERROR_NOT_SUPPORTED"):
                raise PowerPermissionError(f"this GPU does not support setting the power limit ({e}); {hint}") from e
            raise PowerError(f"setting the power limit failed ({e}); {hint}") from e

    @contextmanager
    def applied(self, watts: float | None) -> Iterator[PowerLimits | None]:
        """Run the block with the power limit at ``watts``, restoring the original on every exit path.

        None: the limit is not touched at all (yields None). Otherwise the permission is checked first, then the
        limit is set and given time to take effect (until the enforced limit reads it back, at most
        ``settle_timeout_s``), and the block gets the limits as read then.
        """
        if watts is None:
            yield None
            return
        self.check_permission(watts)
        original_mw = self._nvml.nvmlDeviceGetPowerManagementLimit(self._handle)
        with _SignalGuard() as guard:
            try:
                self._nvml.nvmlDeviceSetPowerManagementLimit(self._handle, round(watts * 1000))
                self._settle(watts)
                yield self.read_limits()
            finally:
                with guard.holding():
                    self._restore(original_mw)

    def _settle(self, watts: float) -> None:
        deadline = time.monotonic() + self.settle_timeout_s
        while True:
            enforced = self._nvml.nvmlDeviceGetEnforcedPowerLimit(self._handle) / 1000
            if abs(enforced - watts) < 1.0:
                return
            if time.monotonic() >= deadline:
                warnings.warn(
                    f"GPU {self.device}: the enforced power limit reads {enforced:g} W, not the requested {watts:g} W "
                    "(another limiter may hold it lower)",
                    stacklevel=3,
                )
                return
            time.sleep(self.poll_s)

    def _restore(self, original_mw: int, attempts: int = 3) -> None:
        for attempt in range(attempts):
            try:
                self._nvml.nvmlDeviceSetPowerManagementLimit(self._handle, original_mw)
                return
            except Exception as e:
                if attempt == attempts - 1:
                    raise PowerError(
                        f"could not restore the power limit of GPU {self.device} to {original_mw / 1000:g} W ({e}); "
                        f"restore it by hand: nvidia-smi -pl {original_mw / 1000:g} (on the right GPU)"
                    ) from e
                time.sleep(self.poll_s)


def decode_clock_events(mask: int) -> list[str]:
    """Names of the clocks-event (throttle) reasons set in ``mask``, lowest bit first; unknown bits as hex."""
    names = []
    bit = 1
    while bit <= mask:
        if mask & bit:
            names.append(CLOCK_EVENT_REASONS.get(bit, f"0x{bit:x}"))
        bit <<= 1
    return names


def summarize_telemetry(samples: list[dict[str, Any]], energy_j: float | None, calls: int) -> dict[str, Any]:
    """Summary of a sampling window. ``samples``: dicts with any of sm_clock_mhz, power_w, temp_c, reasons (bitmask);
    ``energy_j``: the energy counter's change over the window. Means of clock and power, max temperature, the
    union of the reasons and whether any of them throttles (HwSlowdown, thermal, power brake)."""
    if calls < 1:
        raise ValueError(f"calls must be at least 1, got {calls}")

    def values(key):
        return [s[key] for s in samples if s.get(key) is not None]

    clocks, power, temps, masks = values("sm_clock_mhz"), values("power_w"), values("temp_c"), values("reasons")
    union = 0
    for m in masks:
        union |= m
    return {
        "samples": len(samples),
        "sm_clock_mhz": statistics.fmean(clocks) if clocks else None,
        "power_w": statistics.fmean(power) if power else None,
        "temp_c": max(temps) if temps else None,
        "energy_j": energy_j,
        "energy_j_per_call": energy_j / calls if energy_j is not None else None,
        "throttle_reasons": decode_clock_events(union) if masks else None,
        "throttled": bool(union & THROTTLING_MASK) if masks else None,
    }


class TelemetrySampler:
    """Samples SM clock, power, temperature and the clocks-event bitmask every ``interval_s`` in a background
    thread while the block runs, and the energy counter at both ends. NVML calls take milliseconds, so they stay
    out of the timed code.

    Power is ``NVML_FI_DEV_POWER_INSTANT`` where the driver has it, else ``nvmlDeviceGetPowerUsage`` (a ~1 s
    moving average on GA100 and newer); ``summary()["power_source"]`` says which. Without NVML it does nothing and
    ``summary`` returns ``{"reason": ...}``.
    """

    def __init__(self, device: int = 0, nvml: Any | None = None, interval_s: float = 0.02):
        if not interval_s > 0:
            raise InputError(f"interval_s must be positive, got {interval_s}")
        self.device = device
        self.interval_s = interval_s
        self._nvml_arg = nvml
        self._reason: str | None = None
        self._samples: list[dict[str, Any]] = []
        self._energy_mj: list[float | None] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._power_source: str | None = None

    def __enter__(self) -> Self:
        try:
            self._nvml, self._handle = _open(self.device, self._nvml_arg)
        except PowerError as e:
            self._reason = str(e)
            return self
        renamed = getattr(self._nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) is not None
        self._reasons_call = f"nvmlDeviceGetCurrentClocks{'Event' if renamed else 'Throttle'}Reasons"
        self._energy_mj.append(_query(self._nvml, "nvmlDeviceGetTotalEnergyConsumption", self._handle))
        self._sample()
        self._thread = threading.Thread(target=self._run, name="mxbench-telemetry", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> bool:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._sample()
            self._energy_mj.append(_query(self._nvml, "nvmlDeviceGetTotalEnergyConsumption", self._handle))
        return False

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def _power_w(self) -> float | None:
        n, h = self._nvml, self._handle
        if self._power_source in (None, "instant"):
            values = _query(n, "nvmlDeviceGetFieldValues", h, [_const(n, "NVML_FI_DEV_POWER_INSTANT")])
            mw = _field_value(values[0]) if values else None
            if mw is not None:
                self._power_source = "instant"
                return mw / 1000
            if self._power_source is None:  # never had the field: stop asking for it
                self._power_source = "average"
        mw = _query(n, "nvmlDeviceGetPowerUsage", h)
        return None if mw is None else mw / 1000

    def _sample(self) -> None:
        n, h = self._nvml, self._handle
        self._samples.append({
            "sm_clock_mhz": _query(n, "nvmlDeviceGetClockInfo", h, _const(n, "NVML_CLOCK_SM")),
            "power_w": self._power_w(),
            "temp_c": _query(n, "nvmlDeviceGetTemperature", h, _const(n, "NVML_TEMPERATURE_GPU")),
            "reasons": _query(n, self._reasons_call, h),
        })  # fmt: skip

    def summary(self, calls: int) -> dict[str, Any]:
        """The window's summary (see ``summarize_telemetry``) with energy per call over ``calls`` calls, plus
        ``power_source``; ``{"reason": ...}`` when NVML was unavailable."""
        if self._reason is not None:
            return {"reason": self._reason}
        start, end = (self._energy_mj + [None, None])[:2]
        energy_j = (end - start) / 1000 if start is not None and end is not None else None
        return {**summarize_telemetry(self._samples, energy_j, calls), "power_source": self._power_source}


_FIELD_VALUE_ATTRS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


def _field_value(fv: Any) -> float | None:
    """The number in an ``nvmlFieldValue_t`` (None when NVML returned an error for the field)."""
    if getattr(fv, "nvmlReturn", 0) != 0:
        return None
    attr = _FIELD_VALUE_ATTRS.get(getattr(fv, "valueType", None))
    return None if attr is None else getattr(fv.value, attr, None)


def snapshot(device: int = 0, nvml: Any | None = None) -> dict[str, Any]:
    """Run metadata from NVML: driver, name, uuid, clocks (current and max, MHz), power limits (W), power draw,
    temperature, persistence mode, performance state and clocks-event reasons. A field NVML cannot give is None;
    never raises (without NVML every field is None and ``reason`` says why)."""
    try:
        n, h = _open(device, nvml)
        reason = None
    except PowerError as e:
        n, h, reason = None, None, str(e)

    get = functools.partial(_query, n)

    def watts(mw: Any) -> float | None:
        return None if mw is None else mw / 1000

    sm, mem = _const(n, "NVML_CLOCK_SM"), _const(n, "NVML_CLOCK_MEM")
    low, high = get("nvmlDeviceGetPowerManagementLimitConstraints", h) or (None, None)
    reasons = get("nvmlDeviceGetCurrentClocksEventReasons", h)
    if reasons is None:
        reasons = get("nvmlDeviceGetCurrentClocksThrottleReasons", h)
    snap = {
        "driver_version": get("nvmlSystemGetDriverVersion"),
        "name": get("nvmlDeviceGetName", h),
        "uuid": get("nvmlDeviceGetUUID", h),
        "sm_clock_mhz": get("nvmlDeviceGetClockInfo", h, sm),
        "mem_clock_mhz": get("nvmlDeviceGetClockInfo", h, mem),
        "sm_clock_max_mhz": get("nvmlDeviceGetMaxClockInfo", h, sm),
        "mem_clock_max_mhz": get("nvmlDeviceGetMaxClockInfo", h, mem),
        "power_limit_w": watts(get("nvmlDeviceGetPowerManagementLimit", h)),
        "power_limit_default_w": watts(get("nvmlDeviceGetPowerManagementDefaultLimit", h)),
        "power_limit_min_w": watts(low),
        "power_limit_max_w": watts(high),
        "power_limit_enforced_w": watts(get("nvmlDeviceGetEnforcedPowerLimit", h)),
        "power_w": watts(get("nvmlDeviceGetPowerUsage", h)),
        "temperature_c": get("nvmlDeviceGetTemperature", h, _const(n, "NVML_TEMPERATURE_GPU")),
        "persistence_mode": get("nvmlDeviceGetPersistenceMode", h),
        "pstate": get("nvmlDeviceGetPerformanceState", h),
        "clocks_event_reasons": decode_clock_events(reasons) if reasons is not None else None,
    }
    return snap if reason is None else {**snap, "reason": reason}
