"""Tiny models and hand-written DeepSpeed configs for the harness tests (not through
models.ds_config, so these tests stand on their own)."""
from __future__ import annotations

TINY = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 128, "vocab_size": 512, "tie_word_embeddings": False}
TINY_VL = {**TINY, "vision_config": {
    "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
    "patch_size": 4, "image_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2,
    "projector_hidden_size": 64}}


def ds_config(stage: int = 0, micro_batch: int = 1, grad_accum: int = 1, sp: int = 1, checkpoint: bool = False,
              **zero) -> dict:
    """A minimal DeepSpeed config, written here so the tests do not depend on models.ds_config."""
    cfg = {"train_micro_batch_size_per_gpu": micro_batch, "gradient_accumulation_steps": grad_accum,
           "zero_optimization": {"stage": stage, **zero},
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
           "steps_per_print": 10_000}
    if sp > 1:
        cfg["sequence_parallel_size"] = sp
    if checkpoint:
        cfg["activation_checkpointing"] = {"partition_activations": False, "cpu_checkpointing": False}
    return cfg
