"""Whatever a user types ends in one line and a non-zero exit, or in a result: never a traceback.

A table of the inputs users were seen to get wrong, then hypothesis-generated ones for every
option that takes free text, and profiles with one constant made impossible.
"""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from advisor.cli import main
from models.profile import PROFILES_DIR

FAST = ["--model", "tiny-cpu", "--seq", "256"]  # a model whose searches take a fraction of a second


def invoke(args: list[str]):
    return CliRunner().invoke(main, args)


def assert_one_line_or_result(result) -> None:
    """Exit 0, or a non-zero exit with exactly one line that starts with 'Error: '; never a traceback."""
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    if result.exit_code != 0:
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: "), result.output


def assert_one_line_error(result) -> str:
    assert result.exit_code != 0, result.output
    assert_one_line_or_result(result)
    return result.output.strip()


@pytest.mark.parametrize("args, needle", [
    (["recommend", "--model", "7B", "--seq", "4k", "--out-ds-config", "/missing/dir/x.json"], "does not exist"),
    (["recommend", "--model", "7B", "--seq", "4k", "--plot", "/missing/dir/x.png"], "does not exist"),
    (["recommend", "--model", "/tmp", "--seq", "4k"], "holds no config.json"),
    (["recommend", "--model", "", "--seq", "4k"], "no model given"),
    (["predict", "--model", "/dev/null", "--seq", "4k"], "not valid JSON"),
    (["recommend", "--model", "7B", "--seq", "99999999999999999999999"], "at most"),
    (["recommend", "--model", "7B", "--seq", "4k", "--tokens", "1e400"], "at most"),
    (["recommend", "--model", "7B", "--seq", "4k", "--global-batch", "1e30"], "at most"),
    (["recommend", "--model", "7B", "--seq", "4k", "--global-batch", "0"], "sequences"),
    (["recommend", "--model", "7B", "--seq", "4k", "--seed", "-1"], "--seed"),
    (["recommend", "--model", "7B", "--seq", "4k", "--max-slowdown", "inf"], "finite"),
    (["recommend", "--model", "7B", "--seq", "4k", "--max-slowdown", "nan"], "--max-slowdown"),
    (["recommend", "--model", "7B", "--seq", "32k", "--gpus", "200000"], "more than the run's"),
    (["recommend", "--model", "7B", "--seq", "32k", "--gpus", "99999999999"], "at most"),
    (["predict", "--model", "7B", "--seq", "4k", "--checkpointing", "sometimes"], "--checkpointing"),
    (["predict", "--model", "7B", "--seq", "4k", "--offload-ratio", "0.5"], "partial offload ratio"),
    (["predict", "--model", "7B", "--seq", "4k", "--offload-ratio", "1.5"], "--offload-ratio"),
    (["predict", "--model", "7B", "--seq", "4k", "--super-offload", "--zero", "2", "--offload-optimizer", "cpu"],
     "SuperOffload needs ZeRO-3"),
    (["validate", "--model", "7B", "--seq", "4k"], "either --ds-config"),
    (["validate", "--sweep", "/no/such/sweep.jsonl"], "does not exist"),
    # a store that cannot be opened, a config that is not JSON, and (after its minutes of fitting) a profile
    # that could not be written ended in a traceback (2026-12-04)
    (["fit", "--runs", "data/runs/h200-x1-unseen-shapes-2026-12-04.jsonl", "--profile", "h200", "--out",
      "/proc/h200.json"], "cannot write there"),
    (["recommend", "--model", "7B", "--seq", "4k", "--out-ds-config", "/proc/ds.json"], "cannot write there"),
    (["validate", "--sweep", "data/sweeps/h200-x1-no-ckpt-pairs-phases.jsonl", "--workdir", "/proc/w"],
     "cannot make folder /proc/w"),
    (["validate", "--sweep", "data/sweeps/h200-x1-no-ckpt-pairs-phases.jsonl", "--jsonl", "/proc/runs.jsonl"],
     "cannot write there"),
    (["recommend", "--model", "7B", "--seq", "4k", "--validate", "1", "--workdir", "/proc/w"], "cannot make folder"),
    (["wheelhouse", "--out", "/proc/wheels", "--deepspeed-version", "0.19.8"], "cannot make folder"),
    # NaN passes click's FloatRange, infinity its lower bound: a window or budget without end (2026-12-04)
    (["validate", "--sweep", "data/sweeps/h200-x1-no-ckpt-pairs-phases.jsonl", "--precision", "nan"], "not a finite"),
    (["validate", "--sweep", "data/sweeps/h200-x1-no-ckpt-pairs-phases.jsonl", "--min-window-s", "inf"], "not a finite"),
    (["recommend", "--model", "7B", "--seq", "4k", "--validate", "1", "--budget", "inf"], "not a finite"),
    (["calibrate", "--cpu-tdp-w", "nan"], "not a finite"),
    (["calibrate", "--quick", "--out", "/proc/profile.json"], "cannot write there"),
    # a --script template that cannot be filled failed in the run's thread, after the search
    (["recommend", "--model", "tiny-cpu", "--seq", "256", "--validate", "1", "--script", "python 'x {ds_config}"],
     "cannot be split into words"),
    (["recommend", "--model", "tiny-cpu", "--seq", "256", "--validate", "1", "--script", "python {ds_config} {steps}"],
     "has {steps}"),
    (["recommend", "--model", "tiny-cpu", "--seq", "256", "--validate", "1", "--script", "python {ds_config} {}"],
     "empty or numbered"),
    (["validate", "--sweep", "data/sweeps/h200-x1-no-ckpt-pairs-phases.jsonl", "--store", "/proc/runs.db"],
     "not a usable run store"),
    (["validate", "--sweep", "data/sweeps/h200-x1-no-ckpt-pairs-phases.jsonl", "--store", "/proc/no/runs.db"],
     "cannot make its folder"),
    (["validate", "--model", "7B", "--seq", "4k", "--ds-config", "data/sweeps/README.md"], "not valid JSON"),
    (["fit", "--profile", "h200", "--out", "x.json"], "give the runs"),
    # found by the fuzz below: a count past int64 reached numpy
    (["predict", "--model", "tiny-cpu", "--seq", "256", "--gpus", "20000000000000000000"], "not in the range"),
    (["report", "--runs", "/no/such.jsonl", "--profile", "h200"], "not found"),
    (["recommend", "--model", "7B", "--seq", "4k", "--rounds", "2"], "belongs to --validate"),
    (["recommend", "--model", "7B", "--seq", "4k", "--validate", "2", "--tie-margin", "nan"], "--tie-margin"),
    (["recommend", "--model", "7B", "--seq", "4k", "--validate", "2", "--tie-margin", "15"], "write 15%"),
])
def test_bad_input_seen_in_the_wild_is_one_line(args, needle):
    assert needle in assert_one_line_error(invoke(args))


def test_images_for_a_text_model_are_one_line_in_validate_as_in_predict(tmp_path):
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 1}, "train_micro_batch_size_per_gpu": 1}))
    for command in ("predict", "validate"):
        out = assert_one_line_error(invoke([command, "--model", "tiny-cpu", "--seq", "256", "--ds-config", str(path),
                                            "--images", "2", "--workdir" if command == "validate" else "--json",
                                            *([str(tmp_path / "w")] if command == "validate" else [])]))
        assert "no vision encoder" in out, command


@pytest.mark.parametrize("command", ["predict", "validate"])
@pytest.mark.parametrize("content", ['[{"zero_optimization": {"stage": 2}}]', "\xff\xfe"])
def test_a_ds_config_that_holds_no_object_or_no_text_is_one_line(tmp_path, command, content):
    path = tmp_path / "ds_config.json"
    path.write_bytes(content.encode("latin-1"))
    out = assert_one_line_error(invoke([command, "--model", "7B", "--seq", "4k", "--ds-config", str(path)]))
    assert str(path) in out


TEXT = st.one_of(
    st.text(max_size=12),
    st.from_regex(r"-?[0-9]{1,30}(\.[0-9]{1,3})?(e[0-9]{1,4})?[kKmMbBgGtT%]?", fullmatch=True),
    st.sampled_from(["inf", "-inf", "nan", "1e309", "0", "-1", "0x10", "1_000", " ", "4-2", "2-", "∞"]),
)
FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@FUZZ
@given(option=st.sampled_from(["--seq", "--global-batch", "--images", "--frames", "--image-size", "--gpus", "--sp",
                               "--micro-batch", "--grad-accum", "--checkpointing", "--offload-ratio", "--zero",
                               "--cpu-threads-per-rank"]),
       value=TEXT)
def test_predict_survives_any_value(option, value):
    args = ["predict", "--model", "tiny-cpu", "--seq", "256", "--json", option, value]
    if option == "--seq":
        args = ["predict", "--model", "tiny-cpu", "--json", "--seq", value]
    assert_one_line_or_result(invoke(args))


@FUZZ
@given(option=st.sampled_from(["--tokens", "--global-batch", "--max-slowdown", "--gpus", "--trials", "--seed"]),
       value=TEXT)
def test_recommend_survives_any_value(option, value):
    assert_one_line_or_result(invoke(["recommend", *FAST, "--search", "exhaustive", "--json", option, value]))


@FUZZ
@given(option=st.sampled_from(["--rounds", "--tie-margin"]), value=TEXT)
def test_the_loops_options_survive_any_value(option, value):
    assert_one_line_or_result(invoke(["recommend", *FAST, "--search", "exhaustive", "--json", "--validate", "1",
                                      "--plan-only", option, value]))


@FUZZ
@given(model=st.one_of(st.text(max_size=20), st.sampled_from(["7B", "7b", "llama-2-7B", ".", "..", "/", "x.json"])))
def test_any_model_name_is_a_model_or_one_line(model):
    assert_one_line_or_result(invoke(["predict", "--model", model, "--seq", "4k", "--json"]))


def _quantities(node, prefix=""):
    if isinstance(node, dict):
        if {"value", "unit", "source"} <= node.keys():
            yield prefix[:-1]
            return
        for k, v in node.items():
            yield from _quantities(v, f"{prefix}{k}.")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _quantities(v, f"{prefix}{i}.")


GH200 = json.loads((PROFILES_DIR / "gh200.json").read_text())
QUANTITIES = sorted(_quantities(GH200))


@FUZZ
@given(name=st.sampled_from(QUANTITIES), value=st.sampled_from([-1.0, -1e12, 0.0, float("nan"), float("inf")]))
def test_an_impossible_profile_constant_is_named(tmp_path_factory, name, value):
    data = json.loads(json.dumps(GH200))
    node = data
    *path, last = name.split(".")
    for key in path:
        node = node[int(key)] if isinstance(node, list) else node[key]
    node[last]["value"] = value
    path_ = tmp_path_factory.mktemp("profile") / "p.json"
    path_.write_text(json.dumps(data))
    result = invoke(["predict", *FAST, "--profile", str(path_), "--json"])
    zero_allowed = value == 0.0 and (node[last]["unit"] in ("s", "fraction") or name.startswith("memory.")
                                     or name.startswith(("gpu.layer_elementwise.", "gpu.vision_elementwise.")))
    if zero_allowed:  # a time, slowdown, memory term or elementwise width of zero is "absent", not impossible
        assert_one_line_or_result(result)
        return
    message = assert_one_line_error(result)
    assert "bad key" in message and (name in message or name.rsplit(".", 1)[0] in message), message


CONFIG_KEYS = ["hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
               "vocab_size", "tie_word_embeddings", "vision_config", "text_config", "patch_size", "image_size",
               "head_dim", "model_type", "layer_types", "num_local_experts", "embed_dim", "mlp_ratio",
               "spatial_merge_size", "mm_tokens_per_image", "use_qk_norm"]
CONFIG_VALUE = st.one_of(st.none(), st.booleans(), st.integers(-3, 10**6), st.floats(-2, 1e6),
                         st.sampled_from(["", "2", "phi", "full_attention", "linear_attention"]),
                         st.lists(st.one_of(st.integers(0, 5), st.sampled_from(["full_attention", "x"]),
                                            st.lists(st.integers(0, 1), max_size=1)), max_size=2))
SMALL_CONFIG = {"hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                "intermediate_size": 512, "vocab_size": 1000}


@FUZZ
@given(over=st.dictionaries(st.sampled_from(CONFIG_KEYS),
                            st.one_of(CONFIG_VALUE, st.dictionaries(st.sampled_from(CONFIG_KEYS), CONFIG_VALUE, max_size=3)),
                            max_size=3))
def test_predict_survives_any_model_config(tmp_path_factory, over):
    """A config.json of one's own with any key made odd: a prediction or one line (a null vision_config
    ended in a traceback, 2026-12-04)."""
    path = tmp_path_factory.mktemp("model") / "config.json"
    path.write_text(json.dumps({**SMALL_CONFIG, **over}))
    assert_one_line_or_result(invoke(["predict", "--model", str(path), "--seq", "256", "--json"]))
