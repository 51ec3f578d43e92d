import json
import math
import time

import pytest
import torch

from calibration.harness import phase_trace
from calibration.harness.phase_trace import MARKER_KERNEL, DeviceOp, PassTime


def _op(name, start, end, category="kernel"):
    return DeviceOp(name, category, start, end)


def _marker(at_us):
    return _op(MARKER_KERNEL, at_us, at_us + 1.0)


def test_busy_time_is_the_union_of_each_passes_operations_between_markers():
    events = [_marker(0), _op("gemm", 10, 50), _op("Memcpy DtoH", 30, 70, "gpu_memcpy"),  # overlap counts once
              _op("norm", 100, 110), _marker(200), _op("gemm", 210, 260), _marker(300)]
    assert phase_trace.busy_between_markers_s(events) == pytest.approx([70e-6, 50e-6])


def test_operations_before_the_first_marker_belong_to_no_pass_and_order_is_by_start():
    events = [_op("gemm", 250, 280), _marker(300), _op("late", 320, 330), _op("early", 305, 310), _marker(400)]
    assert phase_trace.busy_between_markers_s(events) == pytest.approx([15e-6])


def test_a_chrome_traces_device_operations_are_read_and_host_events_left_out():
    trace = {"traceEvents": [{"cat": "kernel", "name": "k", "ts": 5.0, "dur": 2.0},
                             {"cat": "gpu_memcpy", "name": "Memcpy HtoD", "ts": 9.0, "dur": 1.0},
                             {"cat": "cpu_op", "name": "aten::mm", "ts": 1.0, "dur": 3.0},
                             {"cat": "kernel", "name": "no time"}]}
    assert phase_trace.device_events_of_trace(trace) == [_op("k", 5.0, 7.0),
                                                         _op("Memcpy HtoD", 9.0, 10.0, "gpu_memcpy")]


def test_kernels_are_known_by_the_words_of_their_names():
    """Names as torch.profiler gave them on H200 (cuBLASLt, cuBLAS, SDPA's flash and cuDNN kernels, NCCL)."""
    kinds = {"nvjet_tst_128x256_64x4_2x1_v_bz_coopA_NNT": "gemm",
             "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1": "gemm",
             "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>": "gemm",
             "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>": "attention",
             "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3": "attention",
             "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)": "communication",
             "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>>": "other",
             "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float>": "other"}
    for name, kind in kinds.items():
        assert phase_trace.kernel_class(_op(name, 0, 1)) == kind, name
    assert phase_trace.kernel_class(_op("Memcpy DtoD (Device -> Device)", 0, 1, "gpu_memcpy")) == "copy"
    assert phase_trace.kernel_class(_op("Memset (Device)", 0, 1, "gpu_memset")) == "other"


def test_each_pass_sums_its_operations_by_kind_and_names_its_longest_kernels(monkeypatch):
    monkeypatch.setattr(phase_trace, "TOP_KERNELS", 2)
    events = [_marker(0), _op("nvjet_a", 10, 40), _op("nvjet_a", 50, 70), _op("flash_fwd", 70, 80),
              _op("ncclDevKernel_AllGather", 20, 60), _op("Memcpy HtoD", 60, 65, "gpu_memcpy"), _op("add", 80, 81),
              _marker(100), _op("nvjet_b", 110, 111), _marker(200)]
    first, second = phase_trace.kernels_between_markers(events)
    assert first.by_class_s == pytest.approx({"gemm": 50e-6, "attention": 10e-6, "communication": 40e-6,
                                              "copy": 5e-6, "other": 1e-6})
    # by kind each operation counts whole (the collective beside the GEMMs too): more than the busy union
    assert sum(first.by_class_s.values()) > phase_trace.busy_between_markers_s(events)[0]
    assert first.top == [{"name": "nvjet_a", "calls": 2, "seconds": pytest.approx(50e-6)},
                         {"name": "ncclDevKernel_AllGather", "calls": 1, "seconds": pytest.approx(40e-6)}]
    assert second.by_class_s["gemm"] == pytest.approx(1e-6) and second.top[0]["name"] == "nvjet_b"
    long_name = "x" * (phase_trace.KERNEL_NAME_CHARS + 50)
    (only,) = phase_trace.kernels_between_markers([_marker(0), _op(long_name, 1, 2), _marker(3)])
    assert only.top[0]["name"] == long_name[:phase_trace.KERNEL_NAME_CHARS]


def test_passes_take_the_median_over_marked_steps_and_the_idle_time_is_span_less_busy():
    names = phase_trace.pass_names(2)
    assert names[:4] == [("forward", 0), ("backward", 0), ("step", 0), ("forward", 1)] and len(names) == 6
    host = [[1.0] * 6, [3.0] * 6, [2.0] * 6]
    gpu = [[4.0] * 6, [5.0] * 6, [9.0] * 6]
    passes = phase_trace.pass_times(names, host, gpu, [1.5] * 6)
    assert passes[0] == PassTime("forward", 0, 2.0, 5.0, 1.5) and passes[0].gpu_idle_s == pytest.approx(3.5)
    absent = phase_trace.pass_times(names, host, None, None)[0]
    assert absent.gpu_span_s is None and absent.gpu_busy_s is None and absent.gpu_idle_s is None
    assert absent.kernels is None
    kernels = [phase_trace.PassKernels({"gemm": float(k)}, []) for k in range(6)]
    assert phase_trace.pass_times(names, host, gpu, [1.5] * 6, kernels)[4].kernels.by_class_s == {"gemm": 4.0}


def test_the_cpu_path_writes_host_times_and_reports_the_device_clock_absent(tmp_path):
    calls = []

    def run_step(mark):
        for _ in range(2):
            mark()
            torch.randn(64, 64) @ torch.randn(64, 64)
            mark()
            mark()
        mark()
        calls.append(1)

    phase_trace.trace_passes(run_step, lambda: None, 2, False, tmp_path / "t.json", cuda=False)
    assert len(calls) == phase_trace.MARKED_STEPS and not (tmp_path / "t.json").exists()
    phase_trace.trace_passes(run_step, lambda: None, 2, True, tmp_path / "t.json", cuda=False)
    out = json.loads((tmp_path / "t.json").read_text())
    assert out["device"] == "cpu" and out["step_s"] > 0 and len(out["passes"]) == 6
    forward = out["passes"][0]
    assert forward["name"] == "forward" and forward["host_s"] > 0
    assert forward["gpu_span_s"] is None and forward["gpu_busy_s"] is None and forward["gpu_idle_s"] is None
    assert forward["kernels"] is None  # no device clock, no kernels


def test_the_environment_switch(monkeypatch):
    monkeypatch.setenv(phase_trace.ENV, "0")
    assert not phase_trace.wanted()
    monkeypatch.setenv(phase_trace.ENV, "1")
    assert phase_trace.wanted()


def test_with_a_counter_each_kind_of_pass_gets_a_power_and_without_one_it_is_absent(tmp_path, monkeypatch):
    """The CPU path with a stand-in counter: 100 W throughout, moving every 10 ms."""
    monkeypatch.setattr(phase_trace, "POWER_WINDOW_S", 0.6)
    monkeypatch.setattr(phase_trace, "POWER_STEPS", (4, 40))

    def run_step(mark):
        for _ in range(2):
            for _ in range(3):
                mark()
                time.sleep(0.004)
        mark()

    def counter_j():
        return 100.0 * 0.01 * math.floor(time.perf_counter() / 0.01)

    phase_trace.trace_passes(run_step, lambda: None, 2, True, tmp_path / "t.json", cuda=False, read_gpu_j=counter_j)
    power = json.loads((tmp_path / "t.json").read_text())["pass_power"]
    assert set(power["power_w"]) == {"forward", "backward", "accumulate", "step"}
    assert 20 <= power["steps"] <= 40
    assert len(power["edges"]) == 6 * power["steps"] + power["steps"] and power["step_kinds"][2] == "accumulate"
    assert len(power["counter_changes"]) > power["increments"]  # the raw changes, kept for other readings
    # What the trace keeps is enough to fit again: the same powers from the record alone.
    assert phase_trace.refit_pass_power(power).power_w == pytest.approx(power["power_w"])
    seconds = power["seconds"]
    assert 0.5 * (power["edges"][-1] - power["edges"][0]) < sum(seconds.values()) <= power["edges"][-1] - power["edges"][0]
    # Each kind's accuracy is test_pass_power's (a counter without poll jitter): here the counter is polled
    # on a CPU the scheduler may hold a poll back on for longer than a 4 ms pass (CI, 2026-12-03: one kind
    # at 10 W), so only the energy over the fitted seconds is asserted, which no split between kinds moves.
    mean_w = sum(power["power_w"][k] * seconds[k] for k in seconds) / sum(seconds.values())
    assert mean_w == pytest.approx(100.0, rel=0.05)
    phase_trace.trace_passes(run_step, lambda: None, 2, True, tmp_path / "t.json", cuda=False)
    assert json.loads((tmp_path / "t.json").read_text())["pass_power"] is None


def test_every_rank_runs_the_same_number_of_power_steps_bounded_both_ways():
    assert phase_trace.power_steps(0.1, lambda value, op: value) == 120
    assert phase_trace.power_steps(0.1, lambda value, op: 150.0 if op == "max" else value) == 150
    assert phase_trace.power_steps(10.0, lambda value, op: value) == phase_trace.POWER_STEPS[0]
    assert phase_trace.power_steps(0.001, lambda value, op: value) == phase_trace.POWER_STEPS[1]
