"""`advisor calibrate --quick` on the CPU writes a profile load_profile accepts, and resumes."""
import json

import pytest
from click.testing import CliRunner

from advisor.cmd_calibrate import calibrate
from models.profile import load_profile


def raw_keys(raw):
    return [json.loads(line)["key"] for line in raw.read_text().splitlines()[1:]]


@pytest.fixture(scope="module")
def interrupted_then_finished(tmp_path_factory):
    """A run that only got through GEMMs and attention, then the full command again."""
    out = tmp_path_factory.mktemp("cal") / "cpu.json"
    raw = out.with_name("cpu.raw.jsonl")
    runner = CliRunner()
    first = runner.invoke(calibrate, ["--quick", "--out", str(out), "--only", "gemm", "--only", "attention"])
    after_first = raw_keys(raw)
    second = runner.invoke(calibrate, ["--quick", "--out", str(out)])
    return out, raw, first, after_first, second


def test_partial_run_keeps_raw_results_and_writes_no_profile(interrupted_then_finished):
    out, raw, first, after_first, _ = interrupted_then_finished
    assert first.exit_code != 0
    assert "not measured" in first.output
    assert after_first and all(k.startswith(("gemm/", "attention/")) for k in after_first)


def test_resumed_run_does_not_repeat_finished_benchmarks(interrupted_then_finished):
    out, raw, _, after_first, second = interrupted_then_finished
    assert second.exit_code == 0, second.output
    keys = raw_keys(raw)
    assert keys[: len(after_first)] == after_first
    for k in after_first:
        assert keys.count(k) == 1, f"{k} was measured again"
    assert not any(k.startswith("collective/") for k in keys)  # a group of one times no link


def test_quick_cpu_profile_loads_and_says_it_is_a_cpu_profile(interrupted_then_finished):
    out = interrupted_then_finished[0]
    p = load_profile(out)
    assert p.provenance.kind == "cpu"
    assert p.provenance.torch and p.provenance.host_cpu
    assert p.host.link == "none"
    assert p.power.cpu.measured is False or p.power.cpu.sensor in ("rapl", "grace-hwmon")
    assert "placeholder for a CPU profile" in p.power.gpu.compute.source
    assert p.gpu.gemm_bf16.y[0] > 0 and p.host.cpu_adam.value > 0
    from calibration.microbench.cpu import host_cores, thread_counts

    assert p.host.cpu_adam_threads.x == [float(t) for t in thread_counts(host_cores())]  # 1, 2, 4, ... all cores
    assert 0 < p.host.issue_per_layer.value < 1e-2 and "issue time" in p.host.issue_per_layer.source
    assert p.host.pass_issue.backward.value > 0 and "measured on the CPU path" in p.host.pass_issue.recompute.source
    assert p.host.zero3_hook_pass.checkpointed_forward.value > 0
    assert "measured on the CPU path" in p.host.zero3_hook_pass.recompute.source
    from models.term_basis import basis_of, network_refusal

    assert basis_of(p.intra_node.all_reduce.bus_bandwidth.source) == "placeholder"
    assert network_refusal(p, 2) is not None  # plans on several GPUs need collectives it never timed
    assert basis_of(p.overheads.layer_pass.source) == "placeholder"  # a CPU profile carries no GPU overheads
    assert out.with_name("cpu.raw.jsonl").exists()


def test_third_run_measures_nothing(interrupted_then_finished):
    out, raw, *_ = interrupted_then_finished
    before = raw.read_text()
    result = CliRunner().invoke(calibrate, ["--quick", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert raw.read_text() == before
    assert load_profile(out).name == "cpu-x1"


def test_a_bad_fill_from_fails_before_measuring(tmp_path):
    out = tmp_path / "p.json"
    result = CliRunner().invoke(calibrate, ["--quick", "--out", str(out), "--fill-from", "no-such-profile"])
    assert result.exit_code != 0 and "unknown profile 'no-such-profile'" in result.output
    raw = out.with_name("p.raw.jsonl")
    assert not raw.exists() or raw_keys(raw) == []


def test_ctrl_c_ends_in_one_line_and_keeps_what_was_measured(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "cpu.json"
    raw = tmp_path / "cpu.raw.jsonl"
    # Started as from a terminal, Ctrl-C at its default: a SIGINT ignored by the test process (an
    # earlier test's library may leave it so) would be inherited and the run would never see it.
    proc = subprocess.Popen([sys.executable, "-m", "calibration.calibrate", "--quick", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (not raw.exists() or len(raw.read_text().splitlines()) < 4):
        time.sleep(0.2)
    assert proc.poll() is None, "the calibration ended before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr[-2000:]
    assert "Traceback" not in stderr and "terminate called" not in stderr
    assert stderr.strip().splitlines()[-1].startswith("interrupted; every finished benchmark is saved in")
    assert len(raw_keys(raw)) >= 3 and not out.exists()
