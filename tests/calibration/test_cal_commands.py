"""Command construction without network or GPUs: wheelhouse, torchrun spawning, and small pure helpers."""
import json
import os
import shutil
import subprocess
import sys
import zipfile

import pytest
from click.testing import CliRunner

from advisor import cmd_calibrate
from calibration import wheelhouse as wh
from calibration.environment import busy_or_hot
from calibration.sensors import GpuState
from calibration.microbench.overlap import merged_order, overlapped_slowdowns


def _plan(tmp_path, **kw):
    args = dict(python_version="3.12", platforms=["manylinux2014_x86_64", "manylinux_2_28_x86_64"],
                deepspeed_version="0.19.8", python="py")
    args.update(kw)
    return wh.plan(tmp_path / "wh", **args)


def test_wheelhouse_builds_deepspeed_as_pure_python_wheel(tmp_path):
    ds = _plan(tmp_path)[1]
    assert ds.argv[:4] == ("py", "-m", "pip", "wheel")
    assert "deepspeed==0.19.8" in ds.argv and "--no-deps" in ds.argv and "--no-build-isolation" in ds.argv
    assert ds.env == {"DS_BUILD_OPS": "0"}


def test_wheelhouse_downloads_binaries_for_the_target_python_and_platforms(tmp_path):
    dl = _plan(tmp_path)[2].argv
    assert "download" in dl and "--only-binary=:all:" in dl
    assert dl[dl.index("--python-version") + 1] == "3.12"
    assert [dl[i + 1] for i, a in enumerate(dl) if a == "--platform"] == ["manylinux2014_x86_64", "manylinux_2_28_x86_64"]
    for pkg in ("pydantic", "pydantic-core", "annotated-types", "typing-inspection", "typing-extensions", "hjson",
                "msgpack", "ninja", "py-cpuinfo", "psutil", "einops", "tqdm", "nvidia-ml-py"):
        assert pkg in dl
    assert any(a.startswith("numpy") for a in dl)  # this project's own requirements come along
    assert "torch" not in dl


def test_wheelhouse_includes_this_project_wheel(tmp_path):
    own = _plan(tmp_path)[0].argv
    assert own[3] == "wheel" and own[-1] == str(wh.PROJECT_DIR)


@pytest.fixture(scope="module")
def installed_wheel(tmp_path_factory):
    """The wheelhouse's own-wheel step run for real (pip reaches PyPI for the build's setuptools), and
    the wheel installed into a folder of its own: the advisor as an offline node gets it. Built from a
    copy of the source, because setuptools builds in place and an old build/ folder's files would
    hide package data the configuration no longer names."""
    tmp = tmp_path_factory.mktemp("own-wheel")
    source = tmp / "source"
    for name in ("advisor", "calibration", "models", "runs"):
        shutil.copytree(wh.PROJECT_DIR / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(wh.PROJECT_DIR / "pyproject.toml", source)
    own = wh.plan(tmp / "wh", python_version="3.11", platforms=["manylinux2014_x86_64"], deepspeed_version="0.19.8",
                  project_dir=source)[0]
    wh.run_plan([own], echo=lambda m: None)
    wheel, = (tmp / "wh").glob("energy_advisor-*.whl")
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--quiet", "--target", str(tmp / "site"),
                    str(wheel)], check=True)
    return wheel, tmp / "site"


def _installed(site, *args):
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run([sys.executable, *args], cwd=site.parent, env=env, capture_output=True, text=True,
                          timeout=300)


def test_the_own_wheel_holds_presets_profiles_and_datasheets(installed_wheel):
    wheel, _ = installed_wheel
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in ("models/presets/llama-2-7b.json", "models/presets/qwen2.5-vl-7b.json", "models/profiles/gh200.json",
                 "models/profiles/h100.json", "models/profiles/h200.json", "models/profiles/h200.band.json",
                 "calibration/datasheets/gh200.json", "calibration/harness/window.py"):
        assert name in names, name
    assert not any(n.startswith("data/") or n.endswith(".raw.jsonl") for n in names)  # evidence stays in the repo


def test_the_installed_wheel_reads_its_data_from_where_it_is_installed(installed_wheel):
    _, site = installed_wheel
    done = _installed(site, "-c", "import models, json; from models.profile import shipped_profiles; "
                                  "from models.architecture import known_presets; "
                                  "from calibration.derive import load_datasheet; "
                                  "print(json.dumps([models.__file__, shipped_profiles(), len(known_presets()), "
                                  "load_datasheet('h100').name]))")
    assert done.returncode == 0, done.stderr
    where, profiles, presets, sheet = json.loads(done.stdout)
    assert where.startswith(str(site))
    assert profiles == ["gh200", "h100", "h200"] and presets >= 20 and sheet == "h100"


def test_wheelhouse_from_an_installed_wheel_says_it_needs_the_source(installed_wheel, tmp_path):
    _, site = installed_wheel
    done = _installed(site, "-m", "advisor.cli", "wheelhouse", "--out", str(tmp_path / "wh"),
                      "--deepspeed-version", "0.19.8")
    assert done.returncode == 1
    assert done.stderr.strip().count("\n") == 0 and "Traceback" not in done.stderr
    assert "checkout of the repository" in done.stderr


def test_default_platforms_cover_several_glibc_versions():
    tags = wh.default_platforms("aarch64")
    assert "manylinux2014_aarch64" in tags and "manylinux_2_28_aarch64" in tags
    assert all(t.endswith("aarch64") for t in tags)


def test_run_plan_passes_env_and_stops_at_first_failure(tmp_path):
    calls = []

    def runner(argv, env, check):
        calls.append((argv, env.get("DS_BUILD_OPS")))
        if "download" in argv:
            raise subprocess.CalledProcessError(1, argv)

    with pytest.raises(subprocess.CalledProcessError):
        wh.run_plan(_plan(tmp_path), runner=runner, echo=lambda m: None)
    assert [c[1] for c in calls] == [None, "0", None]


def test_wheelhouse_command_runs_the_plan_and_writes_install_note(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(wh.subprocess, "run", lambda argv, env, check: seen.append(argv))
    out = tmp_path / "wheels"
    result = CliRunner().invoke(cmd_calibrate.wheelhouse, ["--out", str(out), "--python-version", "3.11",
                                                           "--platform", "manylinux2014_aarch64",
                                                           "--deepspeed-version", "0.19.8"])
    assert result.exit_code == 0, result.output
    assert len(seen) == 3
    assert "manylinux2014_aarch64" in seen[2]
    note = (out / "INSTALL.txt").read_text()
    assert "--no-index --find-links" in note and "DS_BUILD_OPS=0" in note


def test_wheelhouse_command_reports_a_failed_step(tmp_path, monkeypatch):
    def fail(argv, env, check):
        raise subprocess.CalledProcessError(2, argv)

    monkeypatch.setattr(wh.subprocess, "run", fail)
    result = CliRunner().invoke(cmd_calibrate.wheelhouse, ["--out", str(tmp_path / "w"), "--deepspeed-version", "1"])
    assert result.exit_code != 0 and "command failed (2)" in result.output


def test_gpus_above_one_starts_torchrun_with_the_options(monkeypatch, tmp_path):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    seen = []
    monkeypatch.setattr(cmd_calibrate.subprocess, "run",
                        lambda argv, check: seen.append(argv) or subprocess.CompletedProcess(argv, 0))
    out = tmp_path / "p.json"
    result = CliRunner().invoke(cmd_calibrate.calibrate, ["--gpus", "2", "--quick", "--out", str(out), "--name", "n1"])
    assert result.exit_code == 0, result.output
    argv = seen[0]
    assert argv[1:4] == ["-m", "torch.distributed.run", "--standalone"]
    assert "--nproc-per-node=2" in argv
    tail = argv[argv.index("calibration.calibrate") + 1:]
    assert tail[:2] == ["--out", str(out)] and "--quick" in tail and tail[tail.index("--name") + 1] == "n1"


def test_more_gpus_than_the_node_has_is_refused(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    result = CliRunner().invoke(cmd_calibrate.calibrate, ["--gpus", "8"])
    assert result.exit_code != 0 and "this node has 2" in result.output


def test_importing_the_commands_does_not_import_torch():
    code = "import sys, advisor.cmd_calibrate; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=wh.PROJECT_DIR)


def test_overlapped_slowdowns_credit_the_lagging_stream_its_alone_speed():
    # a: 2 s alone, 50% slower while overlapped -> ends at 3 s. b: 2 s alone, 100% slower while
    # overlapped: 1.5 s of its work done by t=3, the last 0.5 s alone -> ends at 3.5 s.
    assert overlapped_slowdowns(2.0, 2.0, 3.0, 3.5) == pytest.approx((0.5, 1.0))
    assert overlapped_slowdowns(2.0, 2.0, 3.5, 3.0) == pytest.approx((1.0, 0.5))
    assert overlapped_slowdowns(1.0, 1.0, 1.0, 1.0) == pytest.approx((0.0, 0.0))


def test_merged_order_interleaves_evenly():
    order = merged_order(4, 2)
    assert order.count("a") == 4 and order.count("b") == 2
    assert order[:3] == ["a", "b", "a"]  # b is not left to the end
    assert merged_order(0, 3) == ["b", "b", "b"]


def _state(**kw):
    base = dict(index=0, name="H200", uuid="GPU-x", temperature_c=30.0, power_w=80.0, power_limit_w=700.0,
                utilization_pct=0.0, memory_used_bytes=0, memory_total_bytes=2**37, process_pids=(),
                process_memory_bytes=())
    base.update(kw)
    return GpuState(**base)


def test_busy_or_hot_warnings():
    assert busy_or_hot([_state()]) == []
    assert busy_or_hot([_state(process_pids=(11, 12), memory_used_bytes=2**32)], own_pids={11, 12}) == []
    assert "4.0 GiB in use" in busy_or_hot([_state(process_pids=None, memory_used_bytes=2**32)])[0]
    msgs = busy_or_hot([_state(utilization_pct=95.0, process_pids=(7, 11), temperature_c=75.0, power_w=400.0)],
                       own_pids={11})
    text = " ".join(msgs)
    assert "95% utilised" in text and "pids 7" in text and "75 C" in text and "400 W" in text
