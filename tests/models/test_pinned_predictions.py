"""Predictions pinned: every shipped run and a grid of strategies, on every shipped profile.

A refactor of the cost model must keep these numbers (to 1e-9 relative); a change that means
to move them rewrites the pin in its own commit and says why:

    python tests/models/test_pinned_predictions.py --write
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from models.architecture import load_architecture  # noqa: E402
from models.predict import predict_batch  # noqa: E402
from models.profile import load_profile, shipped_profiles  # noqa: E402
from models.strategy import Strategy, StrategyBatch  # noqa: E402
from models.workload import Workload  # noqa: E402

PIN = Path(__file__).with_name("pinned_predictions.json")
SHIPPED_PROFILES = ("gh200", "h100", "h200")
METRICS = ("step_time_s", "gpu_energy_j", "cpu_energy_j", "allocated_gpu_mem_gib", "peak_gpu_mem_gib",
           "peak_host_mem_gib")
# Workloads of the grid: text models from small to 70B, long context, a frozen and a trained vision tower.
GRID_WORKLOADS = (
    {"model": "qwen2.5-0.5b", "seq_len": 4096},
    {"model": "llama-2-7b", "seq_len": 32768},
    {"model": "llama-2-13b", "seq_len": 8192},
    {"model": "llama-2-70b", "seq_len": 32768},
    {"model": "qwen2.5-3b", "seq_len": 131072},
    {"model": "qwen2.5-vl-7b", "seq_len": 32768, "frames": 64},
    {"model": "qwen2.5-vl-7b", "seq_len": 16384, "images": 4, "train_vision": True},
)


def _workload(spec: dict) -> Workload:
    model = spec["model"]
    if model.endswith(".json") and not Path(model).is_absolute():
        model = str(REPO / model)
    return Workload(load_architecture(model), spec["seq_len"], images=spec.get("images", 0),
                    frames=spec.get("frames", 0), image_size=spec.get("image_size"),
                    train_vision=spec.get("train_vision", False), loss_dtype=spec.get("loss_dtype", "fp32"))


def _grid_strategies(seed: int, n: int = 60) -> list[dict]:
    """Strategies over every searched field, refused ones included (their numbers are pinned too)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        gpus = int(rng.choice([1, 2, 4, 8, 16]))
        opt = str(rng.choice(["none", "cpu"]))
        out.append({
            "gpus": gpus, "gpus_per_node": min(gpus, 4), "zero_stage": int(rng.integers(0, 4)),
            "offload_optimizer": opt, "offload_ratio": float(rng.choice([0.25, 0.5, 1.0, 1.0])),
            "super_offload": bool(rng.random() < 0.25), "offload_param": str(rng.choice(["none", "none", "cpu"])),
            "checkpoint_every": int(rng.choice([0, 1, 2, 4])), "cpu_checkpointing": bool(rng.random() < 0.2),
            "sp": int(rng.choice([1, 2, 4])), "micro_batch": int(rng.choice([1, 2, 4])),
            "grad_accum": int(rng.choice([1, 2, 8])), "overlap_comm": bool(rng.random() < 0.7),
        })
    return out


def _shipped_runs() -> list[dict]:
    """Every shipped run as the fit sees it (runs.measured): its loss dtype and thread count included."""
    from dataclasses import asdict

    from runs.jsonl import read_records
    from runs.measured import to_measured_run

    cases = []
    for path in sorted((REPO / "data/runs").glob("**/*.jsonl")):
        for record in read_records(path):
            c = record.candidate
            if not c.strategy or record.result.status != "ok":
                continue
            run = to_measured_run(record)
            cases.append({"workload": {"model": c.model, "seq_len": c.seq_len, "images": c.images, "frames": c.frames,
                                       "image_size": c.image_size, "train_vision": not c.freeze_vision,
                                       "loss_dtype": run.workload.loss_dtype},
                          "strategy": asdict(run.strategy), "profile": "h200"})
    return cases


def cases() -> list[dict]:
    out = _shipped_runs()
    for i, spec in enumerate(GRID_WORKLOADS):
        for profile in SHIPPED_PROFILES:
            out += [{"workload": spec, "strategy": s, "profile": profile} for s in _grid_strategies(i)]
    return out


def predict_cases(items: list[dict]) -> list[dict]:
    profiles = {name: load_profile(name) for name in SHIPPED_PROFILES}
    out = []
    for case in items:
        batch = StrategyBatch.from_strategies([Strategy(**case["strategy"])])
        p = predict_batch(_workload(case["workload"]), batch, profiles[case["profile"]])
        row = {m: float(np.asarray(getattr(p, m))[0]) for m in METRICS}
        row["feasible"] = bool(p.feasible[0])
        row["phase_time_s"] = {k: float(np.asarray(v)[0]) for k, v in p.phase_time_s.items()}
        out.append(row)
    return out


def _close(a: float, b: float) -> bool:
    if not (np.isfinite(a) and np.isfinite(b)):
        return (np.isnan(a) and np.isnan(b)) or a == b
    return abs(a - b) <= 1e-9 * max(abs(a), abs(b), 1e-12)


@pytest.mark.skipif(not PIN.exists(), reason="no pinned predictions written yet")
def test_predictions_match_the_pin():
    pinned = json.loads(PIN.read_text())
    got = predict_cases(pinned["cases"])
    assert len(got) == len(pinned["predictions"])
    for case, want, have in zip(pinned["cases"], pinned["predictions"], got):
        where = f"{case['workload']} {case['strategy']} on {case['profile']}"
        for m in METRICS:
            assert _close(have[m], want[m]), f"{m}: {have[m]!r} != pinned {want[m]!r} for {where}"
        assert have["feasible"] == want["feasible"], where
        for name, value in want["phase_time_s"].items():
            assert _close(have["phase_time_s"].get(name, 0.0), value), f"phase {name} for {where}"


def test_the_pin_covers_every_shipped_run():
    pinned = json.loads(PIN.read_text())["cases"]
    missing = [c for c in _shipped_runs() if c not in pinned]
    assert not missing, f"{len(missing)} shipped runs are not pinned (rewrite the pin): {missing[:1]}"


def test_every_shipped_profile_is_pinned():
    """A profile added to models/profiles is pinned with the others (rewrite the pin after adding it)."""
    assert shipped_profiles() == sorted(SHIPPED_PROFILES)
    assert {c["profile"] for c in json.loads(PIN.read_text())["cases"]} == set(SHIPPED_PROFILES)


def changed(pinned: dict) -> dict[str, int]:
    """How many pinned numbers each metric (per profile) would change: what a rewrite moves."""
    out: dict[str, int] = {}
    for case, want, have in zip(pinned["cases"], pinned["predictions"], predict_cases(pinned["cases"])):
        for m in METRICS:
            if not _close(have[m], want[m]):
                key = f"{case['profile']} {m}"
                out[key] = out.get(key, 0) + 1
    return out


if __name__ == "__main__":
    if "--diff" in sys.argv:
        print(changed(json.loads(PIN.read_text())) or "no pinned number changes")
        sys.exit(0)
    if "--write" not in sys.argv:
        sys.exit("usage: python tests/models/test_pinned_predictions.py --write | --diff")
    items = cases()
    PIN.write_text(json.dumps({"cases": items, "predictions": predict_cases(items)}) + "\n")
    print(f"pinned {len(items)} predictions in {PIN}")
