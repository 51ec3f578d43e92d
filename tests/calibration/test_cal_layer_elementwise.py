"""A decoder layer's and a ViT block's elementwise kernels: measured on the CPU path, fitted as effective
bytes per width, merged into a profile, and used by the cost model in place of the counted bytes."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from cal_helpers import env, gpu_results

from calibration.fitting import (DECODER_WIDTHS, VISION_WIDTHS, decoder_row, fit_elementwise,
                                 separated_decoder_widths)
from calibration.merge import merged_profile
from calibration.microbench.common import BenchContext, sizes_for
from calibration.microbench import layer as layer_module
from calibration.microbench.layer import bench_layer, bench_vision_block, kernel_class
from calibration.profile_writer import build_profile
from calibration.rawlog import RawLog, RawResult
from models.architecture import load_architecture
from models.flops import counted_layer_bytes_per_token, counted_vit_block_bytes_per_token, micro_step_work
from models.profile import parse_profile
from models.workload import Workload

BANDWIDTH = 4e12
# (hidden, heads' width, KV width, FFN, q/k norms' width, sandwich norms' width): four layers with heads
# as wide as the hidden size and no such norms, as the calibration measured before Qwen3; a Qwen3-shaped
# one as it is, without its q/k norms and with sandwich norms added
WIDTHS = [(896, 896, 128, 4864, 0, 0), (1536, 1536, 256, 8960, 0, 0), (2048, 2048, 256, 11008, 0, 0),
          (4096, 4096, 4096, 11008, 0, 0), (1024, 2048, 1024, 3072, 3072, 0), (1024, 2048, 1024, 3072, 0, 0),
          (1024, 2048, 1024, 3072, 3072, 2048)]
BYTES = {"hidden": 650.0, "attention_dim": 90.0, "kv_dim": 120.0, "ffn": 37.0, "qk_norm_dim": 150.0,
         "sandwich_norm_dim": 110.0}


def layer_rows(shapes=WIDTHS, per=BYTES):
    rows = []
    for h, q, kv, f, qk, sandwich in shapes:
        widths = {"hidden": h, "attention_dim": q, "kv_dim": kv, "ffn": f, "qk_norm_dim": qk,
                  "sandwich_norm_dim": sandwich}
        for t in (4096, 16384):
            rows.append({"preset": f"p{h}-{q}-{qk}", "tokens": t, **widths,
                         "other_s": t * sum(per[k] * widths[k] for k in widths) / BANDWIDTH})
    return rows


def test_the_fit_recovers_each_widths_bytes():
    rows = layer_rows()
    assert separated_decoder_widths(rows) == DECODER_WIDTHS
    fit = fit_elementwise(rows, BANDWIDTH, DECODER_WIDTHS)
    assert fit.bytes_per_element == pytest.approx(BYTES, rel=1e-6)
    assert fit.worst_error < 1e-6


def test_layers_of_one_kind_separate_three_widths_and_older_rows_read_as_such():
    """Heads as wide as the hidden size and no q/k norms (every layer measured before Qwen3's): the
    heads' work is the hidden size's, and the fit has the three widths it can tell apart."""
    old = [{k: v for k, v in r.items() if k not in ("attention_dim", "qk_norm_dim", "sandwich_norm_dim")}
           for r in layer_rows(WIDTHS[:4])]
    rows = [decoder_row(r) for r in old]
    widths = separated_decoder_widths(rows)
    assert widths == ("hidden", "kv_dim", "ffn")
    fit = fit_elementwise(rows, BANDWIDTH, widths)
    assert fit.bytes_per_element == pytest.approx({"hidden": 740.0, "kv_dim": 120.0, "ffn": 37.0}, rel=1e-6)


def test_the_fit_needs_as_many_layers_as_widths_and_keeps_bytes_non_negative():
    with pytest.raises(ValueError, match="at least 6"):
        fit_elementwise(layer_rows()[:5], BANDWIDTH, DECODER_WIDTHS)
    rows = layer_rows(per=dict(BYTES, kv_dim=0.0))
    for r in rows:
        r["other_s"] *= 1.0 - 0.3 * r["kv_dim"] / r["hidden"]  # more KV, less time: unphysical
    fit = fit_elementwise(rows, BANDWIDTH, DECODER_WIDTHS)
    assert min(fit.bytes_per_element.values()) >= 0.0


def test_kernels_are_classed_by_name():
    assert kernel_class("nvjet_sm90_tst_192x192_64x4_2x1_v_bz_coopB_TNN") == "gemm"
    assert kernel_class("aten::addmm") == "gemm"
    assert kernel_class("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma") == "attention"
    assert kernel_class("void at::native::vectorized_elementwise_kernel<4, CUDAFunctor_add<float>>") == "other"
    assert kernel_class("fmha_cutlassF_bf16_aligned_64x64_rf_sm80") == "attention"  # memory-efficient SDPA


def test_the_cpu_path_times_every_class_of_a_harness_block():
    ctx = BenchContext(device=torch.device("cpu"), sizes=sizes_for(True, True))
    row = bench_layer(ctx, "qwen2.5-0.5b", 64)
    assert (row["hidden"], row["attention_dim"], row["kv_dim"], row["ffn"], row["qk_norm_dim"], row["tokens"]) == (
        64, 64, 16, 320, 0, 64)
    assert row["gemm_s"] > 0 and row["other_s"] > 0 and row["attention_s"] >= 0


def test_a_layer_with_q_k_norms_is_timed_without_them_and_with_sandwich_norms():
    without_qk, sandwich = layer_module.WITHOUT_QK_NORM, layer_module.WITH_SANDWICH_NORMS
    layers = [layer for layer, _ in layer_module.cases(quick=False, cpu=False)]
    assert {"qwen3-4b", "qwen3-4b" + without_qk, "qwen3-4b" + sandwich} <= set(layers)
    assert "qwen2.5-3b" + without_qk not in layers  # nothing to leave out
    ctx = BenchContext(device=torch.device("cpu"), sizes=sizes_for(True, True))
    cpu_layers = [layer for layer, _ in layer_module.cases(quick=True, cpu=True)]
    as_is, without, with_sandwich = (bench_layer(ctx, layer, 64) for layer in cpu_layers if layer.startswith("qwen3"))
    assert (as_is["attention_dim"], as_is["kv_dim"], as_is["qk_norm_dim"], as_is["sandwich_norm_dim"]) == (128, 64, 192, 0)
    assert (without["attention_dim"], without["qk_norm_dim"], without["sandwich_norm_dim"]) == (128, 0, 0)
    assert (with_sandwich["qk_norm_dim"], with_sandwich["sandwich_norm_dim"]) == (192, 128)
    assert as_is["preset"] == without["preset"].removesuffix(without_qk) == with_sandwich["preset"].removesuffix(sandwich)
    # the CPU path's layers separate every width
    assert len(cpu_layers) >= len(DECODER_WIDTHS)


def test_the_cpu_path_times_a_vit_block_forward_and_backward_and_forward_alone(monkeypatch):
    """Which steps were timed, not how long they took: at these sizes the forward's time against the
    forward and backward's is the CPU's noise (a loaded CI machine once timed the forward longer)."""
    ran_backward = []

    def timed(ctx, step):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            step()
        ran_backward.append(any("Backward" in event.key for event in prof.key_averages()))
        return real_kernel_seconds(ctx, step)

    real_kernel_seconds = layer_module._kernel_seconds
    monkeypatch.setattr(layer_module, "_kernel_seconds", timed)
    ctx = BenchContext(device=torch.device("cpu"), sizes=sizes_for(True, True))
    row = bench_vision_block(ctx, "vit-96", 2)
    assert (row["hidden"], row["ffn"], row["tokens"]) == (96, 192, 32)
    assert row["gemm_s"] > 0 and row["other_s"] > 0 and row["other_forward_s"] > 0
    assert ran_backward == [True, False]  # forward and backward for other_s, the forward alone for other_forward_s


def vision_rows(per_hidden=900.0, per_ffn=60.0):
    return [{"shape": f"v{h}-{f}", "tokens": t, "hidden": h, "ffn": f,
             "other_s": t * (per_hidden * h + per_ffn * f) / BANDWIDTH}
            for h, f in ((768, 3072), (1152, 4304), (768, 1536)) for t in (4096, 16384)]


def test_a_vit_fit_has_two_widths_and_a_measured_tower_replaces_the_counted_bytes(tmp_path):
    fit = fit_elementwise(vision_rows(), BANDWIDTH, VISION_WIDTHS)
    assert fit.bytes_per_element == pytest.approx({"hidden": 900.0, "ffn": 60.0}, rel=1e-6)
    raw = RawLog(tmp_path / "vit.raw.jsonl", {"kind": "measured", "device": "NVIDIA H200", "gpus_per_node": 1,
                                              "nodes": 1, "quick": False, "machine": "m"})
    for row in vision_rows():
        raw.append(RawResult(f"vision/{row['shape']}/t{row['tokens']}", "vision_elementwise", "ok", row, None, 1.0, "now"))
    base = build_profile(env(), gpu_results(), name="node", raw_file="base.raw.jsonl")
    path = tmp_path / "node.json"
    path.write_text(json.dumps(base))
    merged = parse_profile(merged_profile(raw.path, path))
    vit = merged.gpu.vision_elementwise
    assert vit.per_ffn.value == pytest.approx(60.0 * merged.gpu.hbm_bandwidth.value / BANDWIDTH, rel=1e-6)
    assert merged.gpu.layer_elementwise is None  # only what the raw file measured is replaced

    arch = load_architecture("qwen2.5-vl-7b")
    v = arch.vision
    w = Workload(arch, 8192, images=4, train_vision=True)
    counted = micro_step_work(w, 1, 1, 0)
    measured = micro_step_work(w, 1, 1, 0, None, vit)
    tokens = 4 * v.patches_per_image()
    counted_block = counted_vit_block_bytes_per_token(v.hidden_size, v.intermediate_size)
    extra = tokens * v.num_layers * (vit.bytes_per_token(v.hidden_size, v.intermediate_size) / 3 - counted_block)
    np.testing.assert_allclose(measured.vis_elem_fwd_bytes - counted.vis_elem_fwd_bytes, extra, rtol=1e-9)
    np.testing.assert_allclose(measured.vis_elem_bwd_bytes - counted.vis_elem_bwd_bytes, 2 * extra, rtol=1e-9)
    np.testing.assert_allclose(measured.elem_fwd_bytes, counted.elem_fwd_bytes)  # the decoder's untouched


def _raw_with_layers(tmp_path):
    raw = RawLog(tmp_path / "layers.raw.jsonl", {"kind": "measured", "device": "NVIDIA H200", "gpus_per_node": 1,
                                                 "nodes": 1, "quick": False, "machine": "m"})
    for i, row in enumerate(layer_rows()):
        raw.append(RawResult(f"layer/{row['preset']}/t{row['tokens']}", "layer_elementwise", "ok", row, None, 1.0,
                             "now"))
    return raw.path


def test_merged_layers_replace_the_counted_bytes_in_predictions(tmp_path):
    base = build_profile(env(), gpu_results(), name="node", raw_file="base.raw.jsonl")
    assert "layer_elementwise" not in base["gpu"]  # not measured, no reference: the counted bytes
    path = tmp_path / "node.json"
    path.write_text(json.dumps(base))
    merged = parse_profile(merged_profile(_raw_with_layers(tmp_path), path))
    bandwidth = merged.gpu.hbm_bandwidth.value
    # the same seconds at the profile's own bandwidth: bytes scale with it
    assert merged.gpu.layer_elementwise.per_hidden.value == pytest.approx(650.0 * bandwidth / BANDWIDTH, rel=1e-6)
    assert "layers.raw.jsonl" in merged.gpu.layer_elementwise.per_kv.source

    arch = load_architecture("qwen2.5-1.5b")
    w = Workload(arch, 8192)
    counted = micro_step_work(w, 1, 1, 0)
    measured = micro_step_work(w, 1, 1, 0, merged.gpu.layer_elementwise)
    layer = merged.gpu.layer_elementwise
    per_layer = (layer.per_hidden.value * arch.hidden_size + layer.per_attention.value * arch.attention_dim
                 + layer.per_kv.value * arch.kv_dim + layer.per_ffn.value * arch.intermediate_size) / 3
    extra = 8192 * arch.num_layers * (per_layer - counted_layer_bytes_per_token(arch))
    np.testing.assert_allclose(measured.elem_fwd_bytes - counted.elem_fwd_bytes, extra, rtol=1e-9)
    np.testing.assert_allclose(measured.elem_bwd_bytes - counted.elem_bwd_bytes, 2 * extra, rtol=1e-9)

    # Qwen3's q/k norms: their measured bytes where the calibration separated them, in place of the counted
    qwen3 = load_architecture("qwen3-4b")
    w3 = Workload(qwen3, 8192)
    with_norms = micro_step_work(w3, 1, 1, 0, layer).elem_fwd_bytes
    without = micro_step_work(Workload(dataclasses.replace(qwen3, qk_norm=False), 8192), 1, 1, 0, layer).elem_fwd_bytes
    np.testing.assert_allclose(with_norms - without, 8192 * qwen3.num_layers * layer.per_qk_norm.value * (4096 + 1024) / 3,
                               rtol=1e-9)
    unseparated = layer.model_copy(update={"per_qk_norm": None})
    counted_norms = micro_step_work(w3, 1, 1, 0, unseparated).elem_fwd_bytes - without
    np.testing.assert_allclose(counted_norms, 8192 * qwen3.num_layers * 2 * 2 * (4096 + 1024), rtol=1e-9)
    # Gemma 3's sandwich norms (over 2 x 2560), likewise
    gemma_like = micro_step_work(Workload(dataclasses.replace(qwen3, sandwich_norms=True), 8192), 1, 1, 0,
                                 layer).elem_fwd_bytes
    np.testing.assert_allclose(gemma_like - with_norms,
                               8192 * qwen3.num_layers * layer.per_sandwich_norm.value * 2 * 2560 / 3, rtol=1e-9)
