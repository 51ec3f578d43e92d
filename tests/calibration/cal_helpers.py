"""Synthetic raw results of a GPU calibration, made from known formulas, for the profile writer tests."""
from __future__ import annotations

from calibration.fitting import COLLECTIVE_OPS, bus_factor
from calibration.rawlog import RawLog, RawResult
from models.flops import causal_attention_flops

ALPHA_S = 30e-6
BUS_BW = 200e9


def rr(key, family, data, status="ok", reason=None) -> RawResult:
    return RawResult(key=key, family=family, status=status, data=data, reason=reason, elapsed_s=0.1,
                     time="2026-11-29T00:00:00+00:00")


def ratio_rows(ratios) -> list[dict]:
    """Rows of a pass-ratio family (pass_issue, zero3_hooks): (preset, backward, checkpointed forward,
    recompute) each."""
    return [{"ran": True, "preset": p, "layers": 8, "tokens": 16, "backward_ratio": b, "checkpointed_forward_ratio": f,
             "recompute_ratio": r} for p, b, f, r in ratios]


def ratio_raw(path, family: str, rows: list[dict], device="NVIDIA H200"):
    """A one-GPU machine's raw file holding `rows` of a pass-ratio family, keyed by preset (the same
    keys in every file: a repeat of the same calibration)."""
    raw = RawLog(path, {"kind": "measured", "device": device, "gpus_per_node": 1, "nodes": 1, "quick": False,
                        "machine": "m"})
    for row in rows:
        raw.append(RawResult(f"cpu/{family}/{row['preset']}", family, "ok", row, None, 1.0, "now"))
    return raw.path


def env(kind="measured", world=2, local=2) -> dict:
    return {
        "date": "2026-11-29T00:00:00+00:00", "machine": "node1", "arch": "x86_64",
        "gpu": "NVIDIA H200" if kind == "measured" else None, "gpu_memory_gib": 139.8,
        "gpu_power_limit_w": 700.0 if kind == "measured" else None, "driver": "580.1", "cuda": "13.0",
        "torch": "2.11.0", "deepspeed": "0.19.8", "host_cpu": "Xeon", "host_cores": 32, "host_memory_gib": 250.0,
        "link": "pcie" if kind == "measured" else "none", "python": "3.12", "kind": kind, "quick": False,
        "world_size": world, "gpus_per_node": local, "nodes": world // local, "nvml_scope": "gpu",
        "nvml_scope_basis": "test",
    }


def gpu_results(world=2, power_w=True) -> dict[str, RawResult]:
    out = {}

    def add(r):
        out[r.key] = r

    for i, flops in enumerate([1e10, 1e11, 1e12, 1e13, 1e14]):
        rate = 700e12 * flops / (flops + 5e10)
        add(rr(f"gemm/{i}", "gemm", {"flops": flops, "flop_per_s": rate, "time_s": flops / rate}))
    def attention(s, d, fwd_rate, bwd_rate, batch=1, heads=32):
        fwd = causal_attention_flops(batch, heads, s, d)
        bwd = causal_attention_flops(batch, heads, s, d, backward=True)
        return {"seq_len": s, "head_dim": d, "batch": batch, "heads": heads, "fwd_flops": fwd, "bwd_flops": bwd,
                "fwd_time_s": fwd / fwd_rate, "bwd_time_s": bwd / bwd_rate, "fwd_flop_per_s": fwd_rate,
                "bwd_flop_per_s": bwd_rate}

    for s in (1024, 4096, 16384):
        add(rr(f"attention/{s}", "attention", attention(s, 128, 4e14 + s * 1e10, 3e14 + s * 1e10)))
    add(rr("attention/d64", "attention", attention(2048, 64, 1e12, 1e12)))
    for n, bw in ((2**28, 4.0e12), (2**30, 4.3e12)):
        add(rr(f"hbm/{n}", "hbm", {"bytes": n, "bytes_per_s": bw}))
    for n in (2**20, 2**24, 2**28):
        for d in ("h2d", "d2h"):
            add(rr(f"hostlink/{d}/{n}", "hostlink", {"direction": d, "bytes": n, "bytes_per_s": 55e9 * n / (n + 2**20)}))
    add(rr("cpu/adam", "cpu_adam", {"ran": True, "optimizer": "DeepSpeedCPUAdam", "why": "default",
                                    "params": 2**26, "threads": 32, "params_per_s": 3.4e9}))
    add(rr("cpu/host_memory", "host_memory", {"ran": True, "bytes": 2**30, "threads": 32, "bytes_per_s": 77e9}))
    for op in COLLECTIVE_OPS:
        for n in (2**16, 2**20, 2**24, 2**28):
            t = ALPHA_S + bus_factor(op, world) * n / BUS_BW
            add(rr(f"collective/{op}/intra/g{world}/{n}B", "collective",
                   {"op": op, "scope": "intra", "group_size": world, "bytes": n, "time_s": t,
                    "algbw_bytes_per_s": n / t, "backend": "nccl", "dtype": "bfloat16"}))
    add(rr("memory/framework_reserved", "memory", {"framework_gib": 1.9}))
    for partner, slow in (("all_gather", 0.19), ("all_to_all", 0.38), ("host_copy", -0.004)):
        add(rr(f"overlap/{partner}", "overlap", {"partner": partner, "compute_slowdown": slow, "other_slowdown": 0.65,
                                                 "partner_bytes": 2**28, "world_size": world}))
    for phase, w in (("idle", 81.0), ("dense_compute", 690.0), ("wait", 125.0), ("memory_bound", 480.0),
                     ("host_copy", 136.0), ("collective", 330.0), ("overlap", 630.0)):
        add(rr(f"power/{phase}", "power", {"phase": phase, "gpu_power_w": w if power_w else None,
                                           "cpu_power_w": None, "time_s": 3.0, "workload": "synthetic",
                                           "per_rank": [{}] * world, "cpu_meter": "absent"}))
    return out
