"""`predict` and `recommend` on a machine with only the core dependencies, and the one line the
commands that need the gpu extra give there.

Each command runs in a process of its own where torch, DeepSpeed, psutil and pynvml cannot be
imported (a `sys.meta_path` finder that refuses them and records every attempt), as on a laptop
that installed `energy-advisor` without extras.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GPU_MODULES = ("torch", "deepspeed", "psutil", "pynvml")
# Refuse the modules, run the CLI, then print what was refused as the last line of stderr.
WITHOUT = """
import atexit, json, sys
blocked, tried = set(sys.argv[1].split(",")), []
class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in blocked:
            tried.append(name)
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Refuse())
atexit.register(lambda: print("refused: " + json.dumps(tried), file=sys.stderr))
sys.argv = ["advisor", *sys.argv[2:]]
from advisor.cli import run
run()
"""


def advisor_without(*args, modules=GPU_MODULES, cwd):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", WITHOUT, ",".join(modules), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)
    *rest, last = done.stderr.rstrip("\n").split("\n")
    assert last.startswith("refused: "), done.stderr[-2000:]
    return done, "\n".join(rest), json.loads(last.removeprefix("refused: "))


def test_the_blocker_refuses_what_it_is_given(tmp_path):
    """The harness itself: a command that imports torch is refused, and the refusal is recorded."""
    done, _, refused = advisor_without("calibrate", "--out", str(tmp_path / "p.json"), cwd=tmp_path)
    assert done.returncode != 0
    assert refused and refused[0] == "torch"


@pytest.mark.parametrize("args", [
    ["recommend", "--model", "7B", "--seq", "32k"],
    ["recommend", "--model", "qwen2.5-vl-7b", "--seq", "16k", "--frames", "8", "--profile", "h200", "--json"],
    ["predict", "--model", "7B", "--seq", "32k", "--zero", "3", "--offload-optimizer", "cpu", "--checkpointing",
     "full", "--sp", "2", "--profile", "h200"],
    ["predict", "--model", "llama-2-13b", "--seq", "8k", "--gpus", "8", "--micro-batch", "1", "--json"],
], ids=["recommend", "recommend-vl-json", "predict-flags", "predict-json"])
def test_predict_and_recommend_need_only_the_core(args, tmp_path):
    done, stderr, refused = advisor_without(*args, cwd=tmp_path)
    assert done.returncode == 0, stderr[-3000:]
    assert "Traceback" not in stderr
    assert refused == [], f"tried to import {refused}"
    if "--json" not in args:
        assert "Traceback" not in done.stdout
        if args[0] == "recommend":
            assert '"zero_optimization"' in done.stdout and "deepspeed --num_gpus" in done.stdout
        return
    out = json.loads(done.stdout)
    step = out["recommended"] if args[0] == "recommend" else out
    assert step["step_time_s"] > 0 and step["energy_j"] > 0
    if args[0] == "recommend":
        assert out["ds_config"]["zero_optimization"]["stage"] in (0, 1, 2, 3)


def test_calibrate_without_torch_names_the_extra_in_one_line(tmp_path):
    done, stderr, refused = advisor_without("calibrate", "--quick", "--out", str(tmp_path / "p.json"), cwd=tmp_path)
    assert done.returncode == 1
    assert "torch" in refused
    assert stderr.strip().count("\n") == 0 and "Traceback" not in stderr
    assert "pip install 'energy-advisor[gpu]'" in stderr and "torch" in stderr


def test_real_runs_without_deepspeed_name_the_extra_before_any_starts(tmp_path):
    """torch alone is not enough: the harness subprocesses import DeepSpeed, so the check comes first."""
    config = tmp_path / "ds_config.json"
    config.write_text(json.dumps({"train_batch_size": 1, "train_micro_batch_size_per_gpu": 1,
                                  "zero_optimization": {"stage": 0}}))
    done, stderr, _ = advisor_without("validate", "--model", "tiny-cpu", "--seq", "128", "--ds-config", str(config),
                                      "--workdir", str(tmp_path / "runs"), modules=("deepspeed",), cwd=tmp_path)
    assert done.returncode == 1, stderr[-3000:]
    assert stderr.strip().count("\n") == 0 and "Traceback" not in stderr
    assert "deepspeed is not installed" in stderr and "pip install 'energy-advisor[gpu]'" in stderr
    assert not (tmp_path / "runs" / "runs.jsonl").exists()
