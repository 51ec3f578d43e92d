"""The strategy space: what it holds, and that both searches see the same points."""
import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from advisor.space import build_space, checkpoint_fields, offload_fields
from advisor.strategy_flags import checkpointing_name
from models.architecture import load_architecture
from models.strategy import Strategy, static_reasons


def test_enumerate_lists_exactly_the_valid_points_of_the_flat_space(arch7b):
    space = build_space(arch7b, [2, 4], gpus_per_node=4, global_batch=4)
    listed = space.enumerate(arch7b)
    listed_labels = sorted(listed.strategy(i).label() + f" ov{listed.strategy(i).overlap_comm}" for i in range(len(listed)))
    choices = space.choices()
    valid = []
    for values in itertools.product(*choices.values()):
        s = space.strategy(dict(zip(choices, values)))
        if not space.reasons(s, arch7b):
            valid.append(s.label() + f" ov{s.overlap_comm}")
    assert listed_labels == sorted(set(valid))  # ZeRO-0 with overlap_comm on or off is one point
    assert len(set(listed_labels)) == len(listed_labels) and len(valid) > 100


def test_every_listed_point_has_consistent_batch(arch7b):
    space = build_space(arch7b, [4, 8, 16], gpus_per_node=4, global_batch=32)
    batch = space.enumerate(arch7b)
    for i in range(0, len(batch), 53):
        s = batch.strategy(i)
        assert not static_reasons(s, arch7b)
        assert s.global_batch % (s.dp * s.micro_batch) == 0
        assert s.global_batch == 32  # powers of two up to 16 ranks: the target divides exactly
        assert s.gpus_per_node == min(s.gpus, 4)


def test_sp_divides_heads_kv_heads_and_stays_in_a_node():
    qwen = load_architecture("qwen2.5-vl-7b")  # 28 heads, 4 KV heads
    assert build_space(qwen, [8], gpus_per_node=8, global_batch=8).sp == (1, 2, 4)
    llama = load_architecture("7B")  # 32 heads
    assert build_space(llama, [8], gpus_per_node=8, global_batch=8).sp == (1, 2, 4, 8)
    assert build_space(llama, [16], gpus_per_node=4, global_batch=8).sp == (1, 2, 4)


def test_micro_batch_never_overshoots_the_global_batch(arch7b):
    space = build_space(arch7b, [4], gpus_per_node=4, global_batch=8)
    assert space.micro_batch == (1, 2, 4, 8)
    batch = space.enumerate(arch7b)
    assert set((batch.gpus // batch.sp * batch.micro_batch).tolist()) <= {1, 2, 4, 8}
    s = space.strategy(dict(gpus=4, zero_offload="z0", checkpointing="none", sp=1, micro_batch=8, overlap_comm=True))
    assert any("exceeds the global batch" in r for r in space.reasons(s, arch7b))


@pytest.mark.parametrize("name", ["none", "cpu", "cpu-r0.5", "super", "cpu+param", "super+param"])
def test_offload_names(name):
    f = offload_fields(name)
    assert (f["offload_optimizer"] == "cpu") == (name != "none")
    assert f["super_offload"] == name.startswith("super")
    assert (f["offload_param"] == "cpu") == name.endswith("+param")
    assert f["offload_ratio"] == (0.5 if name == "cpu-r0.5" else 1.0)


def test_checkpoint_choices_parse():
    expected = {"none": (0, False), "full": (1, False), "full+cpu": (1, True), "every-2": (2, False),
                "every-4+cpu": (4, True)}
    for name, (every, cpu) in expected.items():
        assert checkpoint_fields(name) == {"checkpoint_every": every, "cpu_checkpointing": cpu}
    with pytest.raises(ValueError):
        checkpoint_fields("sometimes")


def _spec(base: str, cpu: bool, upper: bool) -> str:
    spec = base + ("+cpu" if cpu else "")
    return spec.upper() if upper else spec


SPECS = st.builds(_spec, st.one_of(st.sampled_from(["none", "full"]), st.integers(1, 64).map(lambda k: f"every-{k}")),
                  st.booleans(), st.booleans())


@given(spec=SPECS)
def test_a_checkpointing_spec_reads_back_to_itself_in_any_case(spec):
    fields = checkpoint_fields(spec)
    assert checkpoint_fields(checkpointing_name(Strategy(**fields))) == fields
    assert fields["cpu_checkpointing"] == spec.lower().endswith("+cpu")


@given(spec=SPECS, extra=st.sampled_from([" ", "+cpu", "+gpu", "0", "-", "+", "\t", "x"]), where=st.booleans())
def test_a_checkpointing_spec_with_anything_more_is_refused(spec, extra, where):
    """Read in part, `every-4+cpu+cpu`, `full+gpu` and `'full+cpu '` had silently dropped their CPU part."""
    longer = extra + spec if where else spec + extra
    if longer.lower().startswith("every-") and extra == "0" and not where:
        return  # every-10 is another good spec
    if extra == "+cpu" and not where and not spec.lower().endswith("+cpu"):
        return  # so is every-4+cpu
    with pytest.raises(ValueError):
        checkpoint_fields(longer)
