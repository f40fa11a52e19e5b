"""Power limits, telemetry and snapshots through a fake NVML; on a GPU, read-only checks of the real one."""

import os
import signal
import threading
import time
from types import SimpleNamespace

import pytest
import torch

from mxbench.instruments import power
from mxbench.instruments.power import PowerController, PowerError, PowerLimits, PowerPermissionError, TelemetrySampler

NO_PERMISSION, NOT_SUPPORTED = 4, 3


class FakeNVMLError(Exception):
    def __init__(self, value):
        super().__init__(f"NVML error {value}")
        self.value = value


class FakeNVML:
    """The pynvml calls mxbench makes, on one fake 700 W GPU. Limits in milliwatts, like NVML.

    ``script``: per telemetry call name, values returned in order (the last one repeats).
    """

    NVML_CLOCK_SM = 1
    NVML_TEMPERATURE_GPU = 0
    NVML_FI_DEV_POWER_INSTANT = 186

    def __init__(self, *, limit_mw=700_000, set_error=None, enforced_lag=0, script=None):
        self.limit_mw = limit_mw
        self.set_error = set_error
        self.enforced_lag = enforced_lag  # reads of the enforced limit before a new setting shows there
        self.enforced_mw = limit_mw
        self.sets = []  # every accepted SetPowerManagementLimit value
        self.handles = []
        self.script = {k: list(v) for k, v in (script or {}).items()}

    def _next(self, name):
        values = self.script[name]
        return values.pop(0) if len(values) > 1 else values[0]

    def nvmlInit(self):
        pass

    def nvmlDeviceGetHandleByIndex(self, index):
        self.handles.append(("index", index))
        return ("h", index)

    def nvmlDeviceGetHandleByUUID(self, uuid):
        self.handles.append(("uuid", uuid))
        return ("h", uuid)

    def nvmlDeviceGetPowerManagementLimit(self, h):
        return self.limit_mw

    def nvmlDeviceGetPowerManagementDefaultLimit(self, h):
        return 700_000

    def nvmlDeviceGetPowerManagementLimitConstraints(self, h):
        return [200_000, 700_000]

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        if self.enforced_lag:
            self.enforced_lag -= 1
            return self.enforced_mw
        self.enforced_mw = self.limit_mw
        return self.enforced_mw

    def nvmlDeviceSetPowerManagementLimit(self, h, mw):
        if self.set_error is not None:
            raise FakeNVMLError(self.set_error)
        self.sets.append(mw)
        self.limit_mw = mw

    # telemetry
    def nvmlDeviceGetClockInfo(self, h, kind):
        assert kind == self.NVML_CLOCK_SM
        return self._next("clock")

    def nvmlDeviceGetFieldValues(self, h, ids):
        assert ids == [self.NVML_FI_DEV_POWER_INSTANT]
        if "instant_mw" not in self.script:
            raise FakeNVMLError(NOT_SUPPORTED)
        value = SimpleNamespace(uiVal=self._next("instant_mw"))
        return [SimpleNamespace(nvmlReturn=0, valueType=1, value=value)]

    def nvmlDeviceGetPowerUsage(self, h):
        return self._next("average_mw")

    def nvmlDeviceGetTemperature(self, h, sensor):
        return self._next("temp")

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return self._next("reasons")

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        return self._next("energy_mj")


@pytest.fixture
def root(monkeypatch):
    """Pretend to be root, so the tests run the same under any user (the fake NVML decides the permission)."""
    monkeypatch.setattr(power, "_is_root", lambda: True)


@pytest.fixture
def sigterm_sentinel():
    """A recognisable SIGTERM handler installed for the test, the process's own put back after it. Signal handlers
    live in the main thread only: elsewhere a real SIGTERM would end the test process."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers can only be installed from the main thread")

    def sentinel(signum, frame):
        raise AssertionError("the sentinel SIGTERM handler should not run")

    previous = signal.signal(signal.SIGTERM, sentinel)
    yield sentinel
    signal.signal(signal.SIGTERM, previous)


def controller(nvml):
    return PowerController(0, nvml=nvml, settle_timeout_s=0.2, poll_s=0.001)


class TestLimits:
    def test_limits_are_read_in_watts(self):
        limits = controller(FakeNVML(limit_mw=650_000)).read_limits()
        assert limits == PowerLimits(current_w=650.0, default_w=700.0, min_w=200.0, max_w=700.0, enforced_w=650.0)

    def test_percents_are_of_the_default_limit(self):
        assert controller(FakeNVML(limit_mw=500_000)).resolve(percents=[100, 75, 50]) == [700.0, 525.0, 350.0]

    def test_watts_pass_through(self):
        assert controller(FakeNVML()).resolve(watts=[300, 700]) == [300.0, 700.0]

    @pytest.mark.parametrize("kwargs", [{}, {"percents": None}, {"percents": []}, {"watts": []}])
    def test_nothing_requested_means_the_limit_as_found(self, kwargs):
        assert controller(FakeNVML()).resolve(**kwargs) == [None]

    @pytest.mark.parametrize("kwargs, name, shown", [
        ({"watts": [150]}, "watts", "150 W"),
        ({"watts": [750]}, "watts", "750 W"),
        ({"percents": [120]}, "percents", "840 W"),  # 120% of 700 W
        ({"percents": [25]}, "percents", "175 W"),
    ])  # fmt: skip
    def test_out_of_range_is_a_clear_error(self, kwargs, name, shown):
        with pytest.raises(ValueError, match=rf"{name}: .*{shown}.*\[200, 700\] W"):
            controller(FakeNVML()).resolve(**kwargs)

    def test_percents_and_watts_together_are_refused(self):
        with pytest.raises(ValueError, match="not both"):
            controller(FakeNVML()).resolve(percents=[50], watts=[300])

    def test_nvml_unavailable_is_a_power_error(self):
        class Broken(FakeNVML):
            def nvmlInit(self):
                raise FakeNVMLError(9)

        with pytest.raises(PowerError, match="NVML is unavailable"):
            PowerController(0, nvml=Broken())

    def test_device_is_mapped_by_uuid_when_torch_knows_it(self, monkeypatch):
        monkeypatch.setattr(power, "_torch_uuid", lambda device: "GPU-1234")
        nvml = FakeNVML()
        PowerController(3, nvml=nvml)
        assert nvml.handles == [("uuid", "GPU-1234")]


class TestApplied:
    def test_none_never_calls_set(self, root):
        nvml = FakeNVML()
        with controller(nvml).applied(None) as limits:
            assert limits is None
        assert nvml.sets == []

    def test_set_settle_and_restore_after_normal_exit(self, root):
        nvml = FakeNVML(enforced_lag=3)
        with controller(nvml).applied(450) as limits:
            assert nvml.limit_mw == 450_000
            assert limits.enforced_w == 450.0  # waited until the enforced limit read the new one back
        assert nvml.limit_mw == 700_000
        assert nvml.sets[-2:] == [450_000, 700_000]

    def test_enforced_limit_that_never_follows_warns_and_goes_on(self, root):
        nvml = FakeNVML(enforced_lag=10**9)
        with pytest.warns(UserWarning, match="enforced power limit"), controller(nvml).applied(450):
            pass
        assert nvml.limit_mw == 700_000

    def test_restore_after_an_exception(self, root):
        nvml = FakeNVML()
        with pytest.raises(RuntimeError, match="kernel failed"), controller(nvml).applied(400):
            raise RuntimeError("kernel failed")
        assert nvml.limit_mw == 700_000

    def test_restore_after_keyboard_interrupt(self, root):
        nvml = FakeNVML()
        with pytest.raises(KeyboardInterrupt), controller(nvml).applied(400):
            raise KeyboardInterrupt
        assert nvml.limit_mw == 700_000

    def test_restore_after_a_real_sigterm(self, root, sigterm_sentinel):
        nvml = FakeNVML()
        with pytest.raises(power.Terminated) as info, controller(nvml).applied(400):
            assert nvml.limit_mw == 400_000
            os.kill(os.getpid(), signal.SIGTERM)
            _wait_for_signal()
        assert info.value.code == 128 + signal.SIGTERM
        assert nvml.limit_mw == 700_000
        assert signal.getsignal(signal.SIGTERM) is sigterm_sentinel

    def test_restore_after_a_real_sigint(self, root, sigterm_sentinel):
        nvml = FakeNVML()
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            with pytest.raises(KeyboardInterrupt), controller(nvml).applied(400):
                os.kill(os.getpid(), signal.SIGINT)
                _wait_for_signal()
        finally:
            signal.signal(signal.SIGINT, previous)
        assert nvml.limit_mw == 700_000
        assert signal.getsignal(signal.SIGTERM) is sigterm_sentinel

    def test_a_signal_during_the_restore_is_held_until_it_is_done(self, root, sigterm_sentinel):
        class SignalledWhileRestoring(FakeNVML):
            restore_finished = False

            def nvmlDeviceSetPowerManagementLimit(self, h, mw):
                super().nvmlDeviceSetPowerManagementLimit(h, mw)
                if mw == 700_000 and len(self.sets) > 2:  # the restore (after the permission check and the set)
                    os.kill(os.getpid(), signal.SIGTERM)
                    time.sleep(0.05)  # a handler that raised would interrupt this
                    self.restore_finished = True

        nvml = SignalledWhileRestoring()
        with pytest.raises(power.Terminated), controller(nvml).applied(400):
            pass
        assert nvml.restore_finished and nvml.limit_mw == 700_000
        assert signal.getsignal(signal.SIGTERM) is sigterm_sentinel

    @pytest.mark.parametrize("code, match", [(NO_PERMISSION, "NoPermission"), (NOT_SUPPORTED, "does not support")])
    def test_permission_error_before_anything_is_set(self, root, code, match):
        nvml = FakeNVML(set_error=code)
        ran = []
        with pytest.raises(PowerPermissionError, match=match), controller(nvml).applied(400):
            ran.append(True)
        assert ran == [] and nvml.sets == [] and nvml.limit_mw == 700_000

    def test_not_root_is_refused_before_nvml_is_asked(self, monkeypatch):
        monkeypatch.setattr(power, "_is_root", lambda: False)
        nvml = FakeNVML()
        with pytest.raises(PowerPermissionError, match="root"):
            controller(nvml).check_permission(400)
        assert nvml.sets == []

    def test_check_permission_changes_nothing(self, root):
        nvml = FakeNVML(limit_mw=650_000)
        controller(nvml).check_permission(400)
        assert nvml.limit_mw == 650_000 and set(nvml.sets) <= {650_000}

    def test_a_failed_restore_says_how_to_restore_by_hand(self, root):
        class RestoreFails(FakeNVML):
            def nvmlDeviceSetPowerManagementLimit(self, h, mw):
                if self.sets and mw == 700_000:
                    raise FakeNVMLError(999)
                super().nvmlDeviceSetPowerManagementLimit(h, mw)

        with pytest.raises(PowerError, match="nvidia-smi -pl 700"):
            with controller(RestoreFails(limit_mw=700_000)).applied(400):
                pass


def _wait_for_signal():
    """Give the interpreter a few bytecode boundaries to run a just-delivered signal handler."""
    for _ in range(200):
        time.sleep(0.005)
    raise AssertionError("the signal was not delivered")


class TestTelemetry:
    def test_decode_clock_event_reasons(self):
        assert power.decode_clock_events(0) == []
        assert power.decode_clock_events(0x4 | 0x40) == ["SwPowerCap", "HwThermalSlowdown"]
        assert power.decode_clock_events(0x1FF) == [
            "GpuIdle", "ApplicationsClocksSetting", "SwPowerCap", "HwSlowdown", "SyncBoost", "SwThermalSlowdown",
            "HwThermalSlowdown", "HwPowerBrakeSlowdown", "DisplayClockSetting",
        ]  # fmt: skip
        assert power.decode_clock_events(0x1000) == ["0x1000"]

    def test_summary_of_samples(self):
        samples = [
            {"sm_clock_mhz": 1980, "power_w": 600.0, "temp_c": 60, "reasons": 0x0},
            {"sm_clock_mhz": 1800, "power_w": 700.0, "temp_c": 66, "reasons": 0x4},
            {"sm_clock_mhz": 1890, "power_w": None, "temp_c": 63, "reasons": 0x4},
        ]
        s = power.summarize_telemetry(samples, energy_j=130.0, calls=1000)
        assert s["sm_clock_mhz"] == 1890.0 and s["power_w"] == 650.0 and s["temp_c"] == 66
        assert s["energy_j"] == 130.0 and s["energy_j_per_call"] == pytest.approx(0.13)
        assert s["throttle_reasons"] == ["SwPowerCap"] and s["throttled"] is False  # a power cap is not throttling

    @pytest.mark.parametrize("mask", [0x8, 0x20, 0x40, 0x80])
    def test_slowdowns_are_throttling(self, mask):
        s = power.summarize_telemetry([{"reasons": 0x4}, {"reasons": mask}], energy_j=None, calls=1)
        assert s["throttled"] is True and s["energy_j_per_call"] is None

    def test_sampler_with_instant_power(self):
        nvml = FakeNVML(script={"clock": [1755], "instant_mw": [512_000], "average_mw": [1], "temp": [61, 70],
                                "reasons": [0x4, 0x0], "energy_mj": [1_000_000, 1_250_000]})  # fmt: skip
        with TelemetrySampler(0, nvml=nvml, interval_s=0.001) as t:
            time.sleep(0.02)
        s = t.summary(calls=500)
        assert s["sm_clock_mhz"] == 1755 and s["power_w"] == 512.0 and s["power_source"] == "instant"
        assert s["temp_c"] == 70 and s["samples"] >= 2
        assert s["energy_j"] == 250.0 and s["energy_j_per_call"] == 0.5
        assert s["throttle_reasons"] == ["SwPowerCap"] and s["throttled"] is False

    def test_sampler_falls_back_to_average_power_and_throttle_reasons(self):
        class OldDriver(FakeNVML):
            nvmlDeviceGetCurrentClocksEventReasons = None  # before the rename

            def nvmlDeviceGetCurrentClocksThrottleReasons(self, h):
                return 0x40

        nvml = OldDriver(script={"clock": [1400], "average_mw": [300_000], "temp": [85], "energy_mj": [0]})
        with TelemetrySampler(0, nvml=nvml, interval_s=0.001) as t:
            time.sleep(0.01)
        s = t.summary(calls=1)
        assert s["power_w"] == 300.0 and s["power_source"] == "average"
        assert s["throttle_reasons"] == ["HwThermalSlowdown"] and s["throttled"] is True
        assert s["energy_j"] == 0.0

    def test_without_nvml_the_sampler_is_a_no_op_with_a_reason(self, monkeypatch):
        def missing():
            raise ImportError("No module named 'pynvml'")

        monkeypatch.setattr(power, "_import_pynvml", missing)
        with TelemetrySampler(0) as t:
            pass
        summary = t.summary(calls=10)
        assert list(summary) == ["reason"] and "nvidia-ml-py is not installed" in summary["reason"]

    def test_bad_calls(self):
        with pytest.raises(ValueError, match="calls"):
            power.summarize_telemetry([], None, calls=0)


class TestSnapshot:
    def test_fields_in_watts_and_names(self):
        class Full(FakeNVML):
            def nvmlSystemGetDriverVersion(self):
                return b"580.65"

            def nvmlDeviceGetName(self, h):
                return "NVIDIA H100 80GB HBM3"

            def nvmlDeviceGetClockInfo(self, h, kind):
                return {1: 1980, 2: 2619}[kind]

            def nvmlDeviceGetCurrentClocksEventReasons(self, h):
                return 0x1

        snap = power.snapshot(0, nvml=Full())
        assert snap["driver_version"] == "580.65" and snap["name"] == "NVIDIA H100 80GB HBM3"
        assert snap["sm_clock_mhz"] == 1980 and snap["mem_clock_mhz"] == 2619
        assert snap["power_limit_w"] == 700.0 and snap["power_limit_min_w"] == 200.0
        assert snap["power_limit_enforced_w"] == 700.0
        assert snap["clocks_event_reasons"] == ["GpuIdle"]
        assert snap["uuid"] is None and snap["pstate"] is None  # calls the fake lacks

    def test_failing_calls_give_none(self):
        class Failing(FakeNVML):
            def __getattribute__(self, name):
                if name.startswith("nvmlDevice") and name != "nvmlDeviceGetHandleByIndex":

                    def fail(*args):
                        raise FakeNVMLError(NOT_SUPPORTED)

                    return fail
                return super().__getattribute__(name)

        snap = power.snapshot(0, nvml=Failing())
        assert snap["name"] is None and snap["power_limit_w"] is None and snap["power_limit_max_w"] is None

    def test_without_nvml_every_field_is_none(self):
        class Broken(FakeNVML):
            def nvmlInit(self):
                raise FakeNVMLError(9)

        snap = power.snapshot(0, nvml=Broken())
        assert "reason" in snap and all(v is None for k, v in snap.items() if k != "reason")


# ------------------------------------------------------------------------------------------------ GPU
# Read-only: the power limit of the GPUs we test on must never change, so every Set call is refused here.


class ReadOnlyNVML:
    def __init__(self, nvml):
        self._nvml = nvml

    def __getattr__(self, name):
        if name.startswith("nvmlDeviceSet"):
            raise AssertionError(f"GPU tests must not call {name}")
        return getattr(self._nvml, name)


@pytest.fixture
def real_nvml():
    return ReadOnlyNVML(pytest.importorskip("pynvml"))


@pytest.mark.gpu
class TestOnGPU:
    def test_snapshot(self, real_nvml):
        snap = power.snapshot(0, nvml=real_nvml)
        assert "reason" not in snap
        assert snap["name"] == torch.cuda.get_device_name(0)
        assert snap["uuid"].lower() == power._torch_uuid(0).lower()
        assert snap["driver_version"] and snap["sm_clock_max_mhz"] > 0 and snap["power_limit_w"] > 0

    def test_read_limits(self, real_nvml):
        limits = PowerController(0, nvml=real_nvml).read_limits()
        assert 0 < limits.min_w <= limits.default_w <= limits.max_w
        assert 0 < limits.enforced_w <= limits.max_w

    def test_telemetry_while_a_gemm_runs(self, real_nvml):
        a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        with TelemetrySampler(0, nvml=real_nvml) as t:
            deadline = time.monotonic() + 0.5
            calls = 0
            while time.monotonic() < deadline:
                a @ a
                torch.cuda.synchronize()
                calls += 1
        s = t.summary(calls)
        assert s["samples"] >= 3 and s["sm_clock_mhz"] > 0 and s["power_w"] > 0 and s["temp_c"] > 0
        assert s["energy_j"] is None or s["energy_j"] > 0
        assert isinstance(s["throttle_reasons"], list)
