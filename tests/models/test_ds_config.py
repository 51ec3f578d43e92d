"""DeepSpeed configs: what we write, DeepSpeed accepts, and we read back the same strategy."""
import json
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from models.ds_config import (
    ZERO_KEYS,
    DsConfigError,
    batch_sizes,
    gpus_from_batch,
    load_ds_config,
    parse_ds_config,
    strategy_from_ds_config,
    to_ds_config,
)
from advisor.space import build_space
from models.strategy import Strategy


def space_sample(arch, n=200):
    """A seeded random spread of the search space: every offload family, checkpointing kind, sp, micro-batch."""
    space = build_space(arch, [4, 8], gpus_per_node=4, global_batch=32)
    batch = space.enumerate(arch)
    return [batch.strategy(i) for i in random.Random(0).sample(range(len(batch)), n)]


def test_round_trip_over_the_space(arch7b, tmp_path):
    strategies = space_sample(arch7b)
    assert {s.offload_ratio for s in strategies} >= {0.25, 0.5, 0.75, 1.0}
    assert {s.checkpoint_every for s in strategies} == {0, 1, 2, 4}
    assert any(s.super_offload and s.offload_param == "cpu" for s in strategies)
    assert {s.sp for s in strategies} == {1, 2, 4}
    path = tmp_path / "ds_config.json"
    for s in strategies:
        path.write_text(json.dumps(to_ds_config(s, arch7b)))
        settings = load_ds_config(path, arch7b)
        gpus = gpus_from_batch(settings, settings.fields.get("sp", 1))
        assert gpus == s.gpus
        assert strategy_from_ds_config(settings, gpus, s.gpus_per_node) == s


def test_missing_keys_take_deepspeed_defaults(arch7b):
    settings = parse_ds_config({"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 2}, arch7b)
    s = strategy_from_ds_config(settings, 8, 4)
    assert s.zero_stage == 3 and s.overlap_comm is True  # DeepSpeed turns overlap_comm on for stage 3 only
    assert s.micro_batch == 2 and s.checkpoint_every == 0 and s.sp == 1
    stage2 = parse_ds_config({"zero_optimization": {"stage": 2}}, arch7b)
    assert "overlap_comm" not in stage2.fields and strategy_from_ds_config(stage2, 4, 4).overlap_comm is False
    explicit = parse_ds_config({"zero_optimization": {"stage": 2, "overlap_comm": True}}, arch7b)
    assert strategy_from_ds_config(explicit, 4, 4).overlap_comm is True
    assert gpus_from_batch(settings, 1) is None


def test_hugging_face_auto_values_count_as_unset(arch7b):
    cfg = {"train_micro_batch_size_per_gpu": "auto", "zero_optimization": {"stage": 2, "reduce_bucket_size": "auto"}}
    fields = parse_ds_config(cfg, arch7b).fields
    assert "micro_batch" not in fields and "reduce_bucket_size" not in fields


def test_hjson_comments_are_read(arch7b, tmp_path):
    path = tmp_path / "c.json"
    path.write_text('{\n  # ZeRO-2 for this run\n  "zero_optimization": {"stage": 2}\n}\n')
    assert load_ds_config(path, arch7b).fields["zero_stage"] == 2


@pytest.mark.parametrize("cfg,key", [
    ({"zero_optimization": {"stage": "three"}}, "stage"),
    ({"zero_optimization": {"stage": 4}}, "zero_optimization.stage"),
    ({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme"}}}, "offload_optimizer.device"),
    ({"zero_optimization": {"stage": 3, "offload_param": {"device": 1}}}, "device"),
    ({"zero_optimization": {"stage": 3, "overlap_comm": "yes"}}, "overlap_comm"),
    ({"zero_optimization": {"stage": 3, "zenflow": {"topk_ratio": 0.1}}}, "zenflow"),
    ({"zero_optimization": []}, "zero_optimization"),
    ({"train_micro_batch_size_per_gpu": 0}, "train_micro_batch_size_per_gpu"),
    ({"activation_checkpointing": {"number_checkpoints": 99}}, "number_checkpoints"),
    ({"sequence_parallel_size": 1.5}, "sequence_parallel_size"),
])
def test_bad_values_name_their_key(arch7b, cfg, key):
    with pytest.raises(DsConfigError, match=key):
        parse_ds_config(cfg, arch7b)


def test_unreadable_files(arch7b, tmp_path):
    with pytest.raises(DsConfigError, match="cannot read"):
        load_ds_config(tmp_path / "missing.json", arch7b)
    bad = tmp_path / "bad.json"
    bad.write_text("{ not json: [")
    with pytest.raises(DsConfigError, match="not valid JSON"):
        load_ds_config(bad, arch7b)


def test_inconsistent_batch_sizes(arch7b):
    settings = parse_ds_config({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 4,
                                "gradient_accumulation_steps": 1}, arch7b)
    with pytest.raises(DsConfigError, match="not a multiple"):
        gpus_from_batch(settings, 1)


SIZES = st.one_of(st.none(), st.integers(1, 64))


@given(train_batch_size=st.integers(1, 4096), micro_batch=SIZES, grad_accum=SIZES, dp=st.integers(1, 64))
def test_batch_sizes_hold_the_train_batch_size_exactly_or_refuse(train_batch_size, micro_batch, grad_accum, dp):
    """As DeepSpeed sets them: what is given is kept, the rest follows, and the three multiply to
    train_batch_size; where no whole numbers can, the config is refused (never rounded to another batch)."""
    candidates = [(mb, train_batch_size // (mb * dp))
                  for mb in ([micro_batch] if micro_batch else range(1, train_batch_size + 1))
                  if train_batch_size % (mb * dp) == 0 and grad_accum in (None, train_batch_size // (mb * dp))]
    try:
        mb, ga = batch_sizes(train_batch_size, micro_batch, grad_accum, dp)
    except DsConfigError as exc:
        assert not candidates and f"train_batch_size {train_batch_size}" in str(exc)
        return
    assert mb * ga * dp == train_batch_size and (mb, ga) in candidates
    assert micro_batch in (None, mb) and grad_accum in (None, ga)
    if micro_batch is None and grad_accum is None:
        assert ga == 1  # DeepSpeed's choice: all of it in one micro-step


def test_a_ds_config_keeps_its_train_batch_size_on_the_gpus_it_runs_on(arch7b):
    settings = parse_ds_config({"train_batch_size": 8}, arch7b)
    assert (strategy_from_ds_config(settings, gpus=4, gpus_per_node=4).micro_batch, 2) == (2, 2)
    with pytest.raises(DsConfigError, match="does not divide by 3 data-parallel GPUs"):
        strategy_from_ds_config(settings, gpus=3, gpus_per_node=3)


@pytest.mark.parametrize("config, key", [
    ({"train_micro_batch_size_per_gpu": 2**70}, "train_micro_batch_size_per_gpu"),
    ({"zero_optimization": {"allgather_bucket_size": 1e30}}, "zero_optimization.allgather_bucket_size"),
    ({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 10**400}}},
     "zero_optimization.offload_optimizer.ratio"),
    ({"fp16": {"enabled": True}, "bf16": {"enabled": True}}, "'fp16.enabled' and 'bf16.enabled'"),
])
def test_a_value_past_its_range_is_refused_naming_the_key(arch7b, config, key):
    with pytest.raises(DsConfigError, match=key.replace(".", r"\.")):
        parse_ds_config(config, arch7b)


@pytest.fixture(scope="module")
def deepspeed_config_class():
    """DeepSpeed's own config class, with the world size it would see under a launcher."""
    import deepspeed.runtime.config as config  # the test extra pins deepspeed: a missing one fails here

    return config


def test_deepspeed_accepts_what_we_write(arch7b, deepspeed_config_class, monkeypatch):
    from deepspeed import comm

    for s in space_sample(arch7b, n=60):
        monkeypatch.setattr(comm, "get_rank", lambda *a, **k: 0)
        monkeypatch.setattr(comm, "get_world_size", lambda *a, s=s, **k: s.gpus)
        cfg = deepspeed_config_class.DeepSpeedConfig(to_ds_config(s, arch7b))
        assert cfg.world_size == s.dp  # DeepSpeed divides the world by sequence_parallel_size
        assert cfg.train_batch_size == s.global_batch
        assert cfg.train_micro_batch_size_per_gpu == s.micro_batch
        assert cfg.gradient_accumulation_steps == s.grad_accum
        assert cfg.bfloat16_config.enabled
        z = cfg.zero_config
        assert int(z.stage) == s.zero_stage and z.overlap_comm == s.overlap_comm
        if s.offload_optimizer == "cpu":
            assert z.offload_optimizer.device == "cpu"
            assert z.offload_optimizer.ratio == s.offload_ratio
            assert z.offload_optimizer.super_offload == s.super_offload
        else:
            assert z.offload_optimizer is None
        assert (z.offload_param is not None and z.offload_param.device == "cpu") == (s.offload_param == "cpu")
        assert cfg.activation_checkpointing_config.cpu_checkpointing == s.cpu_checkpointing


def test_deepspeed_rejects_a_corrupted_config(arch7b, deepspeed_config_class, monkeypatch):
    """The check above has teeth: DeepSpeed refuses unknown ZeRO keys and inconsistent batches."""
    from deepspeed import comm

    monkeypatch.setattr(comm, "get_rank", lambda *a, **k: 0)
    monkeypatch.setattr(comm, "get_world_size", lambda *a, **k: 8)
    s = Strategy(gpus=8, gpus_per_node=4, zero_stage=3, micro_batch=1, grad_accum=4)
    cfg = to_ds_config(s, arch7b)
    cfg["zero_optimization"]["offload_optimiser"] = {"device": "cpu"}
    with pytest.raises(Exception, match="offload_optimiser"):
        deepspeed_config_class.DeepSpeedConfig(cfg)
    cfg = to_ds_config(s, arch7b)
    cfg["train_batch_size"] += 1
    with pytest.raises(AssertionError):
        deepspeed_config_class.DeepSpeedConfig(cfg)


def test_the_zero_keys_we_know_are_deepspeeds_own():
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    names = {f.alias or n for n, f in DeepSpeedZeroConfig.model_fields.items()} | set(DeepSpeedZeroConfig.model_fields)
    assert names == ZERO_KEYS


def test_unknown_keys_are_named_as_warnings(arch7b):
    cfg = {"zero_optimization": {"stage": 2, "overlapcomm": True}, "train_micro_batch_size_pergpu": 2,
           "bf16": {"enabled": True}}
    settings = parse_ds_config(cfg, arch7b, origin="ds.json")
    assert settings.warnings == ("ds.json: unknown key 'train_micro_batch_size_pergpu': DeepSpeed ignores it (a typo?)",
                                 "ds.json: unknown key 'zero_optimization.overlapcomm': DeepSpeed refuses the config")
    assert parse_ds_config(to_ds_config(Strategy(zero_stage=3, offload_optimizer="cpu", checkpoint_every=1), arch7b),
                           arch7b).warnings == ()


@pytest.mark.parametrize("every", range(0, 23))
def test_any_checkpoint_spacing_reads_back_to_the_same_checkpointed_layers(every):
    from models.architecture import load_architecture
    from models.flops import checkpointed_layers

    arch = load_architecture("tinyllama-1.1b")  # 22 layers: many k give the same count
    read = parse_ds_config(to_ds_config(Strategy(checkpoint_every=every), arch), arch).fields["checkpoint_every"]
    assert checkpointed_layers(22, read) == checkpointed_layers(22, every)
