"""Meters: null objects when sensors are missing, RAPL and Grace hwmon on fake sysfs, replay."""
import functools
import time
import warnings

import pytest

from calibration import cpu_power, meters
from calibration.cpu_power import GraceHwmonMeter, RaplMeter, estimate_cpu_power
from calibration.meters import EnergyMonitor, NullCpuMeter, NullGpuMeter, ReplayCpuMeter, ReplayGpuMeter
from calibration.sensors import CpuMeter, GpuMeter, SensorUnavailable


class Clock:
    def __init__(self, times):
        self.times = iter(times)

    def __call__(self):
        return next(self.times)


@pytest.fixture(autouse=True)
def fresh_warnings():
    meters._warned.clear()
    yield
    meters._warned.clear()


def test_missing_nvml_and_sensors_give_null_meters_and_none_fields(monkeypatch, tmp_path):
    from calibration import gpu_nvml

    def no_nvml():
        raise gpu_nvml.NvmlUnavailable("pynvml is not installed: pip install nvidia-ml-py")

    monkeypatch.setattr(gpu_nvml, "NvmlGpuMeter", lambda: no_nvml())
    monkeypatch.setattr(cpu_power, "GraceHwmonMeter", functools.partial(cpu_power.GraceHwmonMeter, tmp_path / "hw"))
    monkeypatch.setattr(cpu_power, "RaplMeter", functools.partial(cpu_power.RaplMeter, tmp_path / "pc"))
    mon = EnergyMonitor(gpu_indices=[0], clock=Clock([1.0, 3.5]))
    assert mon.gpu_meter_kind == "absent" and mon.cpu_meter_kind == "absent"
    with pytest.warns(RuntimeWarning) as caught:
        mon.begin_window("step")
        m = mon.end_window("step")
    assert m.time_s == pytest.approx(2.5)
    assert m.gpu_energy_j is None and m.gpu_power_avg_w is None
    assert m.cpu_energy_j is None and m.cpu_energy_estimated is False
    text = " ".join(str(w.message) for w in caught)
    assert "pip install nvidia-ml-py" in text and "energy_uj" in text
    assert len(caught) == 2  # once per meter, not once per read


def test_null_meter_warns_only_once():
    gpu = NullGpuMeter("no driver")
    with pytest.warns(RuntimeWarning, match="no driver"):
        assert gpu.read_j([0]) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert gpu.read_j([0]) is None


def test_replay_meters_give_energy_power_and_per_gpu_keys():
    gpu = ReplayGpuMeter({0: [100.0, 1600.0], 1: [50.0, 850.0]})
    cpu = ReplayCpuMeter([10.0, 310.0])
    mon = EnergyMonitor([0, 1], gpu_meter=gpu, cpu_meter=cpu, clock=Clock([0.0, 2.0]))
    mon.begin_window("w")
    m = mon.end_window("w")
    assert m.gpu_energy_j == {0: 1500.0, 1: 800.0}
    assert m.gpu_power_avg_w == {0: 750.0, 1: 400.0}
    assert m.cpu_energy_j == 300.0 and not m.cpu_energy_estimated


def test_sync_is_called_at_both_ends_and_windows_are_checked():
    calls = []
    mon = EnergyMonitor([0], sync=lambda: calls.append(1), gpu_meter=ReplayGpuMeter({0: [0.0, 1.0]}),
                        cpu_meter=ReplayCpuMeter([0.0, 1.0]), clock=Clock([0.0, 1.0]))
    mon.begin_window("a")
    with pytest.raises(ValueError):
        mon.begin_window("a")
    mon.end_window("a")
    assert len(calls) == 2
    with pytest.raises(KeyError):
        mon.end_window("a")


def test_estimate_is_used_and_flagged_only_without_a_sensor():
    est = estimate_cpu_power(cores=10, tdp_w=200.0, idle_w=50.0)
    mon = EnergyMonitor([], gpu_meter=NullGpuMeter("x"), cpu_meter=NullCpuMeter("y"), cpu_estimate=est,
                        clock=Clock([0.0, 4.0]))
    with pytest.warns(RuntimeWarning):
        mon.begin_window("w")
        m = mon.end_window("w")
    assert m.cpu_energy_estimated
    assert 4.0 * 50.0 <= m.cpu_energy_j <= 4.0 * 200.0
    # With a real sensor the estimate is ignored.
    mon = EnergyMonitor([0], gpu_meter=ReplayGpuMeter({0: [0.0, 1.0]}), cpu_meter=ReplayCpuMeter([0.0, 7.0]),
                        cpu_estimate=est, clock=Clock([0.0, 4.0]))
    mon.begin_window("w")
    m = mon.end_window("w")
    assert m.cpu_energy_j == 7.0 and not m.cpu_energy_estimated


def test_estimate_basis_says_it_is_an_estimate():
    e = estimate_cpu_power(cores=72)
    assert e.busy_w == pytest.approx(72 * cpu_power.TDP_PER_CORE_W)
    assert 0 < e.idle_w < e.busy_w
    assert "estimate, not measured" in e.basis


def _rapl(root, name, domain, energy_uj, max_uj=1000):
    d = root / domain
    d.mkdir(parents=True)
    (d / "name").write_text(name + "\n")
    (d / "energy_uj").write_text(f"{energy_uj}\n")
    (d / "max_energy_range_uj").write_text(f"{max_uj}\n")
    return d / "energy_uj"


def test_rapl_sums_packages_and_dram_handles_wrap_and_skips_subdomains(tmp_path):
    pkg0 = _rapl(tmp_path, "package-0", "intel-rapl:0", 900)
    pkg1 = _rapl(tmp_path, "package-1", "intel-rapl:1", 100)
    core = _rapl(tmp_path, "core", "intel-rapl:0:0", 0)
    dram = _rapl(tmp_path, "dram", "intel-rapl:0:1", 0)
    meter = RaplMeter(tmp_path)
    assert sorted(meter.domains) == ["intel-rapl:0", "intel-rapl:0:1", "intel-rapl:1"]
    start = meter.read_j()
    pkg0.write_text("200\n")  # wrapped: 900 -> 1000 -> 200 is +300 uJ
    pkg1.write_text("400\n")  # +300 uJ
    dram.write_text("50\n")  # +50 uJ
    core.write_text("999\n")  # inside the package count: ignored
    assert meter.read_j() - start == pytest.approx(650e-6)


def test_rapl_unreadable_or_missing_raises_with_a_fix(tmp_path, monkeypatch):
    with pytest.raises(SensorUnavailable, match="no RAPL"):
        RaplMeter(tmp_path)
    path = _rapl(tmp_path, "package-0", "intel-rapl:0", 1)
    real_read = type(path).read_text

    def deny(self, *a, **k):
        if self.name == "energy_uj":
            raise PermissionError("denied")
        return real_read(self, *a, **k)

    monkeypatch.setattr(type(path), "read_text", deny)
    with pytest.raises(SensorUnavailable, match="run as root"):
        RaplMeter(tmp_path)


def _grace(root, idx, label, microwatts):
    d = root / f"hwmon{idx}" / "device"
    d.mkdir(parents=True)
    (d / "power1_oem_info").write_text(label + "\n")
    (d / "power1_average").write_text(f"{microwatts}\n")


def test_grace_hwmon_integrates_grace_power_and_reads_module_power(tmp_path):
    _grace(tmp_path, 0, "Module Power Socket 0", 600_000_000)
    _grace(tmp_path, 1, "Grace Power Socket 0", 100_000_000)
    _grace(tmp_path, 2, "CPU Power Socket 0", 70_000_000)
    meter = GraceHwmonMeter(tmp_path, sample_interval_s=0.01)
    try:
        t0, e0 = time.monotonic(), meter.read_j()
        time.sleep(0.3)
        e1, t1 = meter.read_j(), time.monotonic()
        assert (e1 - e0) / (t1 - t0) == pytest.approx(100.0, rel=0.05)  # Grace 100 W, never the module
        assert meter.module_power_w() == pytest.approx(600.0)
        assert meter.cpu_power_w() == pytest.approx(100.0)
    finally:
        meter.close()


def test_without_cpu_sensors_every_reason_is_listed(tmp_path, monkeypatch):
    from calibration.sensors import CPU_METERS, open_first

    monkeypatch.setattr(cpu_power, "GraceHwmonMeter", functools.partial(cpu_power.GraceHwmonMeter, tmp_path / "hw"))
    monkeypatch.setattr(cpu_power, "RaplMeter", functools.partial(cpu_power.RaplMeter, tmp_path / "pc"))
    with pytest.raises(SensorUnavailable) as exc:
        open_first(CPU_METERS)
    assert "Grace" in str(exc.value) and "RAPL" in str(exc.value)


class FakeNvml(GpuMeter):
    kind = "nvml"
    device_count = 1

    def __init__(self, watts):
        self.watts = watts

    def power_w(self, i):
        return self.watts

    def read_j(self, idx):
        return {i: 0.0 for i in idx}


class FakeGrace(CpuMeter):
    kind = "grace-hwmon"

    def read_j(self):
        return 0.0

    def module_power_w(self):
        return 650.0

    def cpu_power_w(self):
        return 150.0


@pytest.mark.parametrize("nvml_w,scope", [(640.0, "module"), (505.0, "gpu")])
def test_nvml_scope_is_decided_by_comparison_with_module_power(nvml_w, scope):
    mon = EnergyMonitor([0], gpu_meter=FakeNvml(nvml_w), cpu_meter=FakeGrace())
    got, basis = mon.nvml_scope()
    assert got == scope
    assert "650" in basis


def test_nvml_scope_without_module_meter_is_gpu_and_says_so():
    mon = EnergyMonitor([0], gpu_meter=FakeNvml(500.0), cpu_meter=ReplayCpuMeter([0.0]))
    scope, basis = mon.nvml_scope()
    assert scope == "gpu" and "no module power meter" in basis


class FakeAmdMeter(GpuMeter):
    """What a new vendor's file holds: a GpuMeter whose devices it numbers its own way."""

    kind = "amdsmi"
    device_count = 2

    def __init__(self):
        self.reads = 0

    def meter_indices(self, cuda_indices):
        return [1 - i for i in cuda_indices]

    def read_j(self, indices):
        self.reads += 1
        return {i: 100.0 * self.reads * (i + 1) for i in indices}


def test_a_new_gpu_sensor_is_one_class_and_one_registry_line(monkeypatch):
    monkeypatch.setattr(meters, "GPU_METERS", ("test_cal_meters:FakeAmdMeter", *meters.GPU_METERS))
    mon = EnergyMonitor(gpu_indices=[0], cpu_meter=ReplayCpuMeter([0.0, 5.0]), clock=Clock([0.0, 2.0]))
    assert mon.gpu_meter_kind == "amdsmi"
    mon.begin_window("w")
    m = mon.end_window("w")
    assert m.gpu_energy_j == {0: pytest.approx(200.0)}  # CUDA 0 is the sensor's device 1
