"""A head dim the profile's attention was never measured at is said, not silently clamped."""
from __future__ import annotations

import json

from click.testing import CliRunner

from advisor.cli import main
from advisor.model_notes import head_dim_notes
from models.architecture import architecture_from_config, load_architecture
from models.profile import load_profile

GEMMA_SHAPE = "data/sweeps/gemma-2b-shape.json"  # heads of 256
NARROW_HEADS = {"hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 8,
                "intermediate_size": 512, "vocab_size": 1000}  # heads of 32


def test_heads_outside_the_measured_ones_are_noted_with_the_rate_they_take():
    h200 = load_profile("h200")
    assert (h200.gpu.attention_fwd_head_dim_ratio.x[0], h200.gpu.attention_fwd_head_dim_ratio.x[-1]) == (64, 256)
    (note,) = head_dim_notes(architecture_from_config(NARROW_HEADS, name="narrow-heads"), h200)
    assert "the decoder's attention heads are 32 wide" in note and "timed at 64's rate" in note
    assert head_dim_notes(load_architecture(GEMMA_SHAPE), h200) == []  # 256: measured (machine CB)
    assert head_dim_notes(load_architecture("qwen2.5-7b"), h200) == []  # 128: measured
    assert head_dim_notes(load_architecture("llava-1.5-7b"), h200) == []  # 128 and the tower's 64
    up_to_128 = h200.gpu.attention_fwd_head_dim_ratio.model_copy(update={"x": [64.0, 128.0], "y": [0.77, 1.0]})
    older = h200.model_copy(update={"gpu": h200.gpu.model_copy(update={"attention_fwd_head_dim_ratio": up_to_128})})
    (note,) = head_dim_notes(load_architecture(GEMMA_SHAPE), older)
    assert "the decoder's attention heads are 256 wide" in note and "timed at 128's rate" in note


def test_a_narrow_vision_tower_is_noted_and_a_profile_without_the_curve_says_nothing():
    cfg = {"hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 512,
           "vocab_size": 1000, "vision_config": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                                                 "patch_size": 4, "image_size": 16}}
    arch = architecture_from_config(cfg, name="narrow-tower")
    h200 = load_profile("h200")
    (note,) = head_dim_notes(arch, h200)
    assert "the vision tower's attention heads are 32 wide" in note and "timed at 64's rate" in note
    bare = h200.model_copy(update={"gpu": h200.gpu.model_copy(update={"attention_fwd_head_dim_ratio": None})})
    assert head_dim_notes(load_architecture(GEMMA_SHAPE), bare) == []


def test_recommend_and_predict_carry_the_note(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(NARROW_HEADS))
    runner = CliRunner()
    done = runner.invoke(main, ["recommend", "--model", str(config), "--seq", "4k", "--gpus", "1", "--profile", "h200",
                                "--json"])
    assert done.exit_code == 0, done.output
    notes = json.loads(done.stdout)["notes"]
    assert any("heads are 32 wide" in n for n in notes)
    done = runner.invoke(main, ["predict", "--model", str(config), "--seq", "4k", "--profile", "h200", "--json"])
    assert done.exit_code == 0 and "heads are 32 wide" in done.stderr
    json.loads(done.stdout)  # the JSON stays whole on stdout
