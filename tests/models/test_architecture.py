"""Reading Hugging Face configs: heads sized by an explicit head_dim (Qwen3, Gemma, Mistral-Nemo),
and mixture-of-experts configs refused in one line rather than counted as a dense MLP."""
from __future__ import annotations

import pytest

from models.architecture import ModelConfigError, architecture_from_config, load_architecture
from models.flops import matmul_params, micro_step_work
from models.params import count_params
from models.workload import Workload

# Qwen/Qwen3-4B's config.json widths: 32 heads of 128 on a 2560-wide stream (80 if derived).
QWEN3_4B = {"hidden_size": 2560, "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
            "head_dim": 128, "intermediate_size": 9728, "vocab_size": 151936, "tie_word_embeddings": True}


def test_an_explicit_head_dim_sizes_q_o_k_and_v():
    a = architecture_from_config(QWEN3_4B, name="qwen3-4b")
    assert (a.head_dim, a.attention_dim, a.kv_dim) == (128, 4096, 1024)
    h, f = 2560, 9728
    per_layer = 2 * h * 4096 + 2 * h * 1024 + 3 * h * f + 2 * h
    assert a.layer_params == per_layer
    assert count_params(Workload(a, 4096)).llm == 36 * per_layer + 151936 * h + h == 4_022_458_880
    # a Qwen3 config (its model_type says so) normalises each head of q and k: 2 x 128 weights a layer more
    qwen3 = architecture_from_config({**QWEN3_4B, "model_type": "qwen3"}, name="qwen3-4b")
    assert qwen3.qk_norm and qwen3.llm_params == 4_022_458_880 + 36 * 2 * 128


def test_head_dim_equal_to_hidden_over_heads_changes_nothing():
    base = {**QWEN3_4B, "head_dim": 80}
    derived = {k: v for k, v in QWEN3_4B.items() if k != "head_dim"}
    assert architecture_from_config(base, name="m") == architecture_from_config(derived, name="m")


def test_training_flops_follow_the_attention_width_not_the_hidden_width():
    a = architecture_from_config(QWEN3_4B, name="qwen3-4b")
    seq = 8192
    w = Workload(a, seq)
    n = 36 * (2 * 2560 * 4096 + 2 * 2560 * 1024 + 3 * 2560 * 9728) + 2560 * 151936
    assert matmul_params(w) == n
    per_token = float(micro_step_work(w, micro_batch=1, sp=1, checkpoint_every=0).total_flops()) / seq
    assert per_token == pytest.approx(6 * n + 6 * 36 * 4096 * seq, rel=1e-12)


@pytest.mark.parametrize("key", ["num_local_experts", "num_experts", "n_routed_experts"])
def test_a_mixture_of_experts_config_is_refused(key):
    with pytest.raises(ModelConfigError, match="mixture-of-experts"):
        architecture_from_config({**QWEN3_4B, key: 8}, name="moe")


def test_one_expert_is_a_dense_model():
    assert architecture_from_config({**QWEN3_4B, "num_local_experts": 1}, name="m").head_dim == 128


@pytest.mark.parametrize("head_dim", [0, -64, 64.0, "128", True])
def test_a_head_dim_that_is_not_a_positive_integer_is_refused(head_dim):
    with pytest.raises(ModelConfigError, match="head_dim"):
        architecture_from_config({**QWEN3_4B, "head_dim": head_dim}, name="m")


def test_a_hidden_width_the_heads_do_not_divide_needs_a_head_dim():
    derived = {k: v for k, v in QWEN3_4B.items() if k != "head_dim"}
    with pytest.raises(ModelConfigError, match="no head_dim"):
        architecture_from_config({**derived, "num_attention_heads": 24}, name="m")
    assert architecture_from_config({**QWEN3_4B, "num_attention_heads": 24, "num_key_value_heads": 8},
                                    name="m").attention_dim == 24 * 128


@pytest.mark.parametrize("model_type", ["gpt_neox", "phi", "starcoder2", "gemma2"])
def test_a_decoder_of_another_block_is_refused_not_counted_as_swiglu(model_type):
    with pytest.raises(ModelConfigError, match=f"model_type '{model_type}'"):
        architecture_from_config({**QWEN3_4B, "model_type": model_type}, name="m")


def test_a_cross_attention_vision_model_is_refused_by_its_outer_type():
    cfg = {"model_type": "mllama", "text_config": {**QWEN3_4B, "model_type": "other"},
           "vision_config": {"hidden_size": 1280, "num_hidden_layers": 32, "num_attention_heads": 16,
                             "patch_size": 14, "image_size": 560}}
    with pytest.raises(ModelConfigError, match="model_type 'mllama'"):
        architecture_from_config(cfg, name="m")


@pytest.mark.parametrize("model_type", ["qwen3", "llama", "gemma", "mistral", None])
def test_llama_style_model_types_are_read(model_type):
    assert architecture_from_config({**QWEN3_4B, "model_type": model_type}, name="m").head_dim == 128


def test_a_null_kv_head_count_means_one_per_head():
    a = architecture_from_config({**QWEN3_4B, "num_key_value_heads": None}, name="m")
    assert a.num_kv_heads == a.num_heads == 32


def test_linear_attention_layers_are_refused_and_sliding_ones_read():
    hybrid = {**QWEN3_4B, "layer_types": ["linear_attention", "linear_attention", "full_attention"] * 12}
    with pytest.raises(ModelConfigError, match="linear_attention' are not modelled"):
        architecture_from_config(hybrid, name="m")
    sliding = {**QWEN3_4B, "layer_types": ["sliding_attention", "full_attention"] * 18}
    assert architecture_from_config(sliding, name="m").num_layers == 36


@pytest.mark.parametrize("preset, published_b", [("qwen3-0.6b", 0.6), ("qwen3-1.7b", 1.7), ("qwen3-4b", 4.0),
                                                 ("qwen3-8b", 8.2), ("qwen3-14b", 14.8), ("qwen3-32b", 32.8)])
def test_qwen3_presets_count_the_published_sizes(preset, published_b):
    """Qwen's model cards: 0.6B, 1.7B, 4.0B, 8.2B, 14.8B and 32.8B parameters, embeddings included."""
    assert count_params(Workload(load_architecture(preset), 4096)).llm / 1e9 == pytest.approx(published_b, abs=0.05)


# The vision_config layouts of Qwen2-VL-7B and Qwen2.5-VL-7B as their config.json files give them.
QWEN2_VL_VISION = {"depth": 32, "embed_dim": 1280, "hidden_size": 3584, "hidden_act": "quick_gelu", "mlp_ratio": 4,
                   "num_heads": 16, "in_chans": 3, "patch_size": 14, "spatial_merge_size": 2,
                   "temporal_patch_size": 2}
QWEN2_5_VL_VISION = {"depth": 32, "hidden_act": "silu", "hidden_size": 1280, "intermediate_size": 3420,
                     "num_heads": 16, "in_chans": 3, "out_hidden_size": 3584, "patch_size": 14,
                     "spatial_merge_size": 2, "temporal_patch_size": 2, "window_size": 112}
QWEN2_7B_TEXT = {"hidden_size": 3584, "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
                 "intermediate_size": 18944, "vocab_size": 152064}


def test_qwen2_vl_s_tower_is_embed_dim_wide_with_a_plain_mlp_and_a_merged_width_projector():
    v = architecture_from_config({**QWEN2_7B_TEXT, "model_type": "qwen2_vl", "vision_config": QWEN2_VL_VISION},
                                 name="qwen2-vl-7b").vision
    # Hugging Face's module tree: blocks of 1280 with fc1 1280 -> 5120, a merger 5120 -> 5120 -> 3584
    assert (v.hidden_size, v.intermediate_size, v.gated_mlp, v.projector_hidden_size) == (1280, 5120, False, 5120)


def test_qwen2_5_vl_s_tower_has_a_gated_mlp():
    v = architecture_from_config({**QWEN2_7B_TEXT, "model_type": "qwen2_5_vl", "vision_config": QWEN2_5_VL_VISION},
                                 name="qwen2.5-vl-7b").vision
    # gate_proj and up_proj 1280 -> 3420, down_proj 3420 -> 1280; the merger 5120 -> 5120 -> 3584
    assert (v.hidden_size, v.intermediate_size, v.gated_mlp, v.projector_hidden_size) == (1280, 3420, True, 5120)


@pytest.mark.parametrize("ratio", [0, -1, "4", None, True, float("nan")])
def test_an_mlp_ratio_that_is_not_a_positive_number_is_refused(ratio):
    with pytest.raises(ModelConfigError, match="mlp_ratio"):
        architecture_from_config({**QWEN2_7B_TEXT, "vision_config": {**QWEN2_VL_VISION, "mlp_ratio": ratio}}, name="m")


def test_a_tower_that_pools_its_patches_to_fewer_tokens_is_refused():
    """Gemma 3 averages a 64x64 patch grid down to 256 tokens; counted as this model merges, 4096."""
    siglip = {"hidden_size": 1152, "num_hidden_layers": 27, "num_attention_heads": 16, "intermediate_size": 4304,
              "patch_size": 14, "image_size": 896}
    cfg = {"model_type": "gemma3", "mm_tokens_per_image": 256, "text_config": {**QWEN3_4B, "head_dim": 256},
           "vision_config": siglip}
    with pytest.raises(ModelConfigError, match="mm_tokens_per_image is 256.*give 4096"):
        architecture_from_config(cfg, name="m")
    assert architecture_from_config({**cfg, "mm_tokens_per_image": 4096}, name="m").vision.patches_per_image() == 4096


def test_qwen2_vl_7b_counts_its_published_size():
    """Hugging Face lists Qwen2-VL-7B at 8.29B parameters; read at its merger's width, the tower alone
    came to several billion."""
    a = architecture_from_config({**QWEN2_7B_TEXT, "model_type": "qwen2_vl", "vision_config": QWEN2_VL_VISION},
                                 name="qwen2-vl-7b")
    c = count_params(Workload(a, 8192, images=1))
    assert (c.llm + c.vision_encoder + c.projector) / 1e9 == pytest.approx(8.29, abs=0.01)


def test_a_newer_qwen2_5_vl_config_is_read_by_its_depth_and_its_tower_s_own_type():
    """transformers 4.53+ writes the text under text_config, a model_type in vision_config, and a stray
    num_hidden_layers of 1 beside depth 32 (Qwen2.5-VL-3B's config.json)."""
    vision = {**QWEN2_5_VL_VISION, "model_type": "qwen2_5_vl", "num_hidden_layers": 1, "out_hidden_size": 2048}
    text = {"hidden_size": 2048, "num_hidden_layers": 36, "num_attention_heads": 16, "num_key_value_heads": 2,
            "intermediate_size": 11008, "vocab_size": 151936, "tie_word_embeddings": True}
    v = architecture_from_config({"text_config": text, "vision_config": vision}, name="qwen2.5-vl-3b").vision
    assert (v.num_layers, v.num_heads, v.gated_mlp) == (32, 16, True)


@pytest.mark.parametrize("cfg, expected", [({"model_type": "qwen3"}, True), ({"model_type": "gemma3_text"}, True),
                                           ({"model_type": "llama"}, False), ({}, False),
                                           ({"model_type": "qwen3", "use_qk_norm": False}, False),
                                           ({"qk_norm": True}, True)])
def test_qk_norm_follows_the_model_type_unless_the_config_says(cfg, expected):
    assert architecture_from_config({**QWEN3_4B, **cfg}, name="m").qk_norm is expected


def test_a_qk_norm_flag_that_is_not_a_boolean_is_refused():
    with pytest.raises(ModelConfigError, match="use_qk_norm"):
        architecture_from_config({**QWEN3_4B, "use_qk_norm": "yes"}, name="m")


def test_qwen3_presets_normalise_q_and_k():
    assert all(load_architecture(f"qwen3-{size}").qk_norm for size in ("0.6b", "1.7b", "4b", "8b", "14b", "32b"))
