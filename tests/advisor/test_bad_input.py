"""Whatever a user types ends in one line and a non-zero exit, or in a result: never a traceback.

A table of the inputs users were seen to get wrong, then hypothesis-generated ones for every
option that takes free text, and profiles with one constant made impossible. Then each boundary
where a file comes in or goes out, by the kinds a QA pass found broken: numbers too large for their
type, impossible profiles, poisoned run records, outputs that must not be replaced, inconsistent
DeepSpeed configs, specifications almost right, missing extras, hangs. Each of those cases is
refused in one line on stderr, within seconds, and leaves no file behind.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from advisor.cli import main
from models.profile import load_profile
from models.strategy import Strategy
from runs.record import Candidate, RunRecord, RunResult

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
    (["predict", "--model", "/dev/null", "--seq", "4k"], "not a regular file"),
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


GH200 = json.loads(load_profile("gh200").to_json())
QUANTITIES = sorted(_quantities(GH200))


@FUZZ
@given(name=st.sampled_from(QUANTITIES),
       value=st.sampled_from([-1.0, -1e12, 0.0, float("nan"), float("inf"), 1e30, 2**70, True, "139.8"]))
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


# --- Each boundary where a file comes in or goes out -------------------------------------------------------

LIMIT_S = 10.0  # "within a few seconds": the slowest refusal here takes about one on a loaded machine
REPO = Path(__file__).resolve().parents[2]
TINY = {"hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 512, "vocab_size": 1000}


def _tree(folder: Path) -> list[tuple[str, int, int]]:
    """Every entry under `folder` with its size and modification time: what a refused command must not change."""
    return sorted((str(p.relative_to(folder)), p.lstat().st_size, p.lstat().st_mtime_ns) for p in folder.rglob("*"))


def refused(folder: Path, args: list[str], needle: str) -> str:
    """`advisor ARGS` run in `folder`: a non-zero exit, one line on stderr that holds `needle` (no
    traceback), within LIMIT_S, nothing written or changed in `folder`. The line."""
    before, cwd = _tree(folder), os.getcwd()
    os.chdir(folder)
    try:
        started = time.monotonic()
        result = CliRunner().invoke(main, args)
        elapsed_s = time.monotonic() - started
    finally:
        os.chdir(cwd)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code != 0, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "Traceback" not in result.output, result.output
    assert needle in lines[0], lines[0]
    assert elapsed_s < LIMIT_S, f"{elapsed_s:.1f} s"
    assert _tree(folder) == before
    return lines[0]


def refused_in_a_process(folder: Path, args: list[str], needle: str, **popen) -> str:
    """The same in a process of its own, for what the test process cannot survive or observe: a command
    that would hang, standard output full or closed. Python's start-up counts against the limit."""
    before = _tree(folder)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "advisor.cli", *args], cwd=folder, env=env, stderr=subprocess.PIPE,
                          text=True, timeout=3 * LIMIT_S, **{"stdout": subprocess.DEVNULL, **popen})
    elapsed_s = time.monotonic() - started
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and len(lines) == 1 and lines[0].startswith("Error: "), done.stderr
    assert needle in lines[0], lines[0]
    assert elapsed_s < 3 * LIMIT_S
    assert _tree(folder) == before
    return lines[0]


def write_json(path: Path, value) -> Path:
    path.write_text(json.dumps(value))
    return path


def a_profile(**values) -> dict:
    """The shipped gh200 profile with constants' values replaced (dotted names)."""
    data = json.loads(load_profile("gh200").to_json())
    for name, value in values.items():
        node = data
        *path, last = name.split(".")
        for key in path:
            node = node[int(key)] if isinstance(node, list) else node[key]
        node[last]["value"] = value
    return data


def run_line(seq_len: int = 256, **result) -> dict:
    """One run record as a run file holds it: qwen2.5-0.5b on one GPU, its result's fields replaced."""
    strategy = Strategy(zero_stage=2)
    candidate = Candidate(model="qwen2.5-0.5b", seq_len=seq_len, strategy=asdict(strategy),
                          ds_config={"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": 1})
    measured = {"status": "ok", "step_time_s": 0.2, "gpu_energy_j": 120.0, "peak_gpu_mem_gib": 9.0,
                "peak_gpu_reserved_gib": 10.0, "peak_host_mem_gib": 4.0, **result}
    return json.loads(RunRecord.now(candidate, RunResult(**measured)).to_json_line())


def run_file(path: Path, lines: list[dict]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


@pytest.fixture
def runs4(tmp_path) -> Path:
    """Four usable runs."""
    return run_file(tmp_path / "runs.jsonl", [run_line(seq) for seq in (256, 512, 1024, 2048)])


# Numbers too large for their type: OverflowError, MemoryError and numpy's TypeError were seen.
@pytest.mark.parametrize("key, value", [("num_hidden_layers", 10**30), ("vocab_size", 10**30),
                                        ("hidden_size", 2**62), ("intermediate_size", 10**25)])
def test_a_model_config_number_past_its_type_is_refused_naming_the_key(tmp_path, key, value):
    model = write_json(tmp_path / "config.json", {**TINY, key: value})
    refused(tmp_path, ["predict", "--model", str(model), "--seq", "256"], f"key '{key}'")


@pytest.mark.parametrize("key, value, named", [
    ("train_micro_batch_size_per_gpu", 1e20, "train_micro_batch_size_per_gpu"),
    ("zero_optimization", {"stage": 2, "reduce_bucket_size": 1e30}, "zero_optimization.reduce_bucket_size"),
    ("gradient_accumulation_steps", 10**40, "gradient_accumulation_steps"),
])
def test_a_ds_config_number_past_its_type_is_refused_naming_the_key(tmp_path, key, value, named):
    config = write_json(tmp_path / "ds.json", {key: value})
    refused(tmp_path, ["predict", *FAST, "--ds-config", str(config)], f"bad key '{named}'")


def _file_options(path: Path) -> list[list[str]]:
    """Every option that reads a file, given `path`."""
    return [["predict", "--model", str(path), "--seq", "256"], ["predict", *FAST, "--ds-config", str(path)],
            ["predict", *FAST, "--profile", str(path)], ["report", "--runs", str(path), "--profile", "gh200"],
            ["fit", "--runs", str(path), "--profile", "gh200", "--out", "out.json"],
            ["validate", "--sweep", str(path)]]


@pytest.mark.parametrize("which", range(6))
def test_json_nested_200000_deep_is_refused_by_every_reader(tmp_path, which):
    path = tmp_path / "deep.json"
    path.write_text("[" * 200_000 + "]" * 200_000)
    refused(tmp_path, _file_options(path)[which], "nested deeper")


@pytest.mark.parametrize("which", range(6))
def test_a_device_is_refused_by_every_reader_without_reading_it(tmp_path, which):
    zero = tmp_path / "zero.json"  # read whole, /dev/zero ran the machine out of memory
    zero.symlink_to("/dev/zero")
    refused(tmp_path, _file_options(zero)[which], "not a regular file")


@pytest.mark.parametrize("which", range(6))
def test_a_fifo_is_refused_by_every_reader_without_waiting_on_it(tmp_path, which):
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    refused_in_a_process(tmp_path, _file_options(fifo)[which], "not a regular file")


@pytest.mark.parametrize("which", range(6))
def test_a_binary_file_is_refused_by_every_reader(tmp_path, which):
    path = tmp_path / "image.json"  # a PNG under a JSON name
    path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe")
    refused(tmp_path, _file_options(path)[which], "not UTF-8 text")


# Profiles with impossible values.
@pytest.mark.parametrize("name, value", [
    ("gpu.memory_gib", 1e30), ("gpu.hbm_bandwidth", 1e30), ("gpus_per_node", 2.5), ("gpus_per_node", 1e9),
    ("host.cores", 0.5), ("host.memory_gib", 1e-9), ("gpu.memory_gib", True), ("gpu.memory_gib", "139.8"),
])
def test_an_impossible_profile_is_refused_naming_its_file_and_key(tmp_path, name, value):
    profile = write_json(tmp_path / "p.json", a_profile(**{name: value}))
    line = refused(tmp_path, ["recommend", *FAST, "--profile", str(profile), "--search", "exhaustive"],
                   f"bad key '{name}")
    assert str(profile) in line and "--gpus" not in line  # a flag the user never gave


# Run files that would poison the fit: refused naming the file, line and field.
@pytest.mark.parametrize("field, value", [
    ("step_time_s", 1e-30), ("step_time_s", 1e30), ("step_time_s", "0.5"), ("gpu_energy_j", float("inf")),
    ("gpu_energy_j", -5.0), ("peak_gpu_mem_gib", -1.0), ("step_times_s", [0.2, -0.2]),
])
@pytest.mark.parametrize("command", ["fit", "report"])
def test_a_poisoned_run_is_refused_naming_file_line_and_field(tmp_path, runs4, command, field, value):
    lines = [json.loads(line) for line in runs4.read_text().splitlines()]
    lines[1]["result"][field] = value
    run_file(runs4, lines)
    out = ["--out", "fitted.json"] if command == "fit" else []
    refused(tmp_path, [command, "--runs", str(runs4), "--profile", "gh200", *out], f"runs.jsonl:2: not a run record "
                                                                                     f"(result.{field}")


def test_a_run_of_zero_stage_5_is_refused(tmp_path, runs4):
    lines = [json.loads(line) for line in runs4.read_text().splitlines()]
    lines[2]["candidate"]["strategy"]["zero_stage"] = 5
    run_file(runs4, lines)
    refused(tmp_path, ["fit", "--runs", str(runs4), "--profile", "gh200", "--out", "fitted.json"],
            "runs.jsonl:3: not a run record (candidate.strategy: ZeRO stage must be 0-3, got 5")


def test_a_torn_last_line_is_said_naming_file_and_line(tmp_path, runs4):
    runs4.write_text(runs4.read_text() + '{"key": "half a rec')
    result = CliRunner().invoke(main, ["report", "--runs", str(runs4), "--profile", "gh200", "--json"])
    assert result.exit_code == 0, result.output
    assert "runs.jsonl:5: the last line is cut short" in result.stderr
    assert json.loads(result.stdout)["runs_summary"]["used"] == 4


# Outputs that must not be replaced, and outputs checked before the work.
def test_fit_never_writes_over_a_device_a_link_or_what_it_reads(tmp_path, runs4):
    mine = write_json(tmp_path / "mine.json", json.loads(load_profile("gh200").to_json()))
    (tmp_path / "link.json").symlink_to(mine)
    fit = ["fit", "--runs", str(runs4), "--no-loo"]
    refused(tmp_path, [*fit, "--profile", "gh200", "--out", "/dev/null"], "not a regular file")
    refused(tmp_path, [*fit, "--profile", "gh200", "--out", "link.json"], "a symbolic link")
    refused(tmp_path, [*fit, "--profile", str(mine), "--out", "mine.json"], "the file this command reads")
    refused(tmp_path, [*fit, "--profile", "gh200", "--out", str(runs4)], "the file this command reads")


def test_fit_never_writes_over_the_shipped_profile_it_reads(tmp_path, runs4):
    from models.profile import profile_path

    refused(tmp_path, ["fit", "--runs", str(runs4), "--profile", "h200", "--out", str(profile_path("h200"))],
            "the file this command reads")


@pytest.mark.parametrize("plot, needle", [("missing/x.png", "does not exist"), ("/proc/x.png", "cannot write there")])
def test_report_checks_its_plot_before_the_work(tmp_path, runs4, plot, needle):
    refused(tmp_path, ["report", "--runs", str(runs4), "--profile", "gh200", "--plot", plot], needle)


def test_a_full_standard_output_is_one_line(tmp_path):
    with open("/dev/full", "w") as full:
        refused_in_a_process(tmp_path, ["predict", "--model", "7B", "--seq", "4k", "--profile", "h200", "--json"],  # a step without notes
                             "cannot write to standard output", stdout=full)


def test_a_closed_standard_output_is_one_line_before_any_work(tmp_path):
    refused_in_a_process(tmp_path, ["predict", *FAST, "--json"], "standard output is closed", stdout=None,
                         preexec_fn=lambda: os.close(1))


# DeepSpeed configs that DeepSpeed itself refuses.
@pytest.mark.parametrize("flags", [["--gpus", "3"], ["--grad-accum", "2"]])
def test_a_train_batch_size_that_cannot_hold_is_refused_not_rounded(tmp_path, flags):
    config = write_json(tmp_path / "ds.json", {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 1,
                                               "gradient_accumulation_steps": 1})
    line = refused(tmp_path, ["predict", *FAST, "--ds-config", str(config), *flags], "DeepSpeed refuses")
    assert flags[0] in line


def test_fp16_with_bf16_is_refused(tmp_path):
    config = write_json(tmp_path / "ds.json", {"fp16": {"enabled": True}, "bf16": {"enabled": True}})
    refused(tmp_path, ["predict", *FAST, "--ds-config", str(config)], "'fp16.enabled' and 'bf16.enabled'")


# Specifications almost right.
@pytest.mark.parametrize("spec", ["full+gpu", "every-4+cpu+cpu", "full+cpu ", "every-0", "every-04", " none"])
def test_a_checkpointing_spec_almost_right_is_refused(tmp_path, spec):
    refused(tmp_path, ["predict", *FAST, "--checkpointing", spec], "--checkpointing")


def test_checkpointing_specs_are_case_insensitive_and_read_whole():
    result = CliRunner().invoke(main, ["predict", *FAST, "--checkpointing", "Every-2+CPU", "--json"])
    strategy = json.loads(result.stdout)["strategy"]
    assert (strategy["checkpoint_every"], strategy["cpu_checkpointing"]) == (2, True)


def test_seq_counts_in_binary_multiples_and_global_batch_in_decimal():
    out = json.loads(CliRunner().invoke(main, ["predict", "--model", "tiny-cpu", "--seq", "1k", "--global-batch",
                                               "1k", "--gpus", "1", "--json"]).stdout)
    assert (out["tokens_per_step"], out["global_batch"]) == (1024 * 1000, 1000)
    help_text = CliRunner().invoke(main, ["predict", "--help"]).output
    assert "4k = 4096" in help_text and "2k = 2000" in help_text


# calibrate on an install without torch: its arguments first, then the extra to install.
@pytest.mark.parametrize("args, needle", [
    (["--gpus", "0"], "--gpus"), (["--fill-from", "nosuch"], "unknown profile 'nosuch'"),
    (["--cpu-tdp-w", "100", "--cpu-idle-w", "200"], "--cpu-idle-w"),
    (["--quick", "--out", "new/profile.json"], "pip install 'energy-advisor[gpu]'"),
])
def test_calibrate_without_torch_checks_its_arguments_then_names_the_extra(tmp_path, monkeypatch, args, needle):
    monkeypatch.setitem(sys.modules, "torch", None)
    refused(tmp_path, ["calibrate", *args], needle)


# Hangs.
def test_fit_refuses_more_jobs_than_cores_and_more_folds_than_runs(tmp_path, runs4):
    fit = ["fit", "--runs", str(runs4), "--profile", "gh200", "--out", "fitted.json"]
    refused(tmp_path, [*fit, "--jobs", "100000"], "bad --jobs 100000")
    refused(tmp_path, [*fit, "--folds", "1000"], "more folds than the 4 runs")


@pytest.mark.parametrize("args, needle", [
    (["--python-version", "abc"], "--python-version"), (["--python-version", "2.7"], "--python-version"),
    (["--arch", "sparc"], "--arch"), (["--deepspeed-version", "not a version"], "--deepspeed-version"),
])
def test_wheelhouse_refuses_a_target_pip_cannot_use(tmp_path, args, needle):
    refused(tmp_path, ["wheelhouse", "--out", "wheels", "--dry-run", "--deepspeed-version", "0.19.8", *args], needle)


# Generated: integers beyond 64 bits, deep nesting, binary files, poisoned run records.
BEYOND_64_BITS = st.one_of(st.integers(min_value=2**63, max_value=10**4000), st.integers(max_value=-(2**63)))
FILES = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@FILES
@given(key=st.sampled_from(sorted(TINY)), value=BEYOND_64_BITS)
def test_any_integer_beyond_64_bits_in_a_model_config_is_named(tmp_path_factory, key, value):
    folder = tmp_path_factory.mktemp("big")
    model = write_json(folder / "config.json", {**TINY, key: value})
    refused(folder, ["predict", "--model", str(model), "--seq", "256"], f"key '{key}'")


@FILES
@given(key=st.sampled_from(["train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                            "sequence_parallel_size"]), value=BEYOND_64_BITS)
def test_any_integer_beyond_64_bits_in_a_ds_config_is_named(tmp_path_factory, key, value):
    folder = tmp_path_factory.mktemp("big")
    config = write_json(folder / "ds.json", {key: value})
    refused(folder, ["predict", *FAST, "--ds-config", str(config)], f"bad key '{key}'")


@FILES
@given(name=st.sampled_from(QUANTITIES), value=BEYOND_64_BITS)
def test_any_integer_beyond_64_bits_in_a_profile_is_named(tmp_path_factory, name, value):
    folder = tmp_path_factory.mktemp("big")
    profile = write_json(folder / "p.json", a_profile(**{name: value}))
    line = refused(folder, ["predict", *FAST, "--profile", str(profile)], "bad key")
    assert name in line or name.rsplit(".", 1)[0] in line


def _nested(depth: int, kind: str) -> str:
    return "[" * depth + "]" * depth if kind == "list" else '{"a": ' * depth + "1" + "}" * depth


@FILES
@given(depth=st.integers(min_value=65, max_value=300_000), kind=st.sampled_from(["list", "dict"]),
       which=st.integers(0, 5))
def test_json_nested_too_deep_is_refused_by_every_reader(tmp_path_factory, depth, kind, which):
    folder = tmp_path_factory.mktemp("deep")
    path = folder / "deep.json"
    path.write_text(_nested(depth, kind))
    refused(folder, _file_options(path)[which], "nested deeper")


@FILES
@given(data=st.binary(min_size=1, max_size=64).filter(lambda b: not _is_utf8(b)), which=st.integers(0, 5))
def test_any_binary_file_is_refused_by_every_reader(tmp_path_factory, data, which):
    folder = tmp_path_factory.mktemp("binary")
    path = folder / "data.json"
    path.write_bytes(data)
    refused(folder, _file_options(path)[which], "not UTF-8 text")


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


# A field of a run record and values none of its kind may take.
POISON = st.sampled_from([-1.0, -1e30, 1e30, float("inf"), float("-inf"), float("nan"), 10**30, "0.5", True, []])
RESULT_FIELDS = ["step_time_s", "gpu_energy_j", "cpu_energy_j", "peak_gpu_mem_gib", "peak_gpu_reserved_gib",
                 "peak_host_mem_gib", "tokens_per_s", "window_s", "gpu_alloc_retries", "world_size"]
STRATEGY_FIELDS = ["gpus", "zero_stage", "micro_batch", "grad_accum", "sp", "checkpoint_every", "offload_ratio",
                   "reduce_bucket_size", "cpu_threads_per_rank"]


@FILES
@given(where=st.sampled_from([("result", f) for f in RESULT_FIELDS] + [("strategy", f) for f in STRATEGY_FIELDS]
                             + [("candidate", "seq_len"), ("candidate", "gpus")]),
       value=POISON, command=st.sampled_from(["fit", "report"]))
def test_any_poisoned_run_record_is_refused_naming_its_line(tmp_path_factory, where, value, command):
    folder = tmp_path_factory.mktemp("poison")
    lines = [run_line(seq) for seq in (256, 512, 1024)]
    section, field = where
    node = lines[1]["candidate"]["strategy"] if section == "strategy" else lines[1][section]
    node[field] = value
    runs = run_file(folder / "runs.jsonl", lines)
    out = ["--out", "fitted.json"] if command == "fit" else []
    line = refused(folder, [command, "--runs", str(runs), "--profile", "gh200", *out], "runs.jsonl:2: not a run record")
    assert field in line or "ZeRO stage" in line or "positive" in line or "offload ratio" in line, line


@pytest.mark.parametrize("option", ["--model", "--profile", "--ds-config", "--plot"])
def test_a_path_the_system_refuses_is_one_line(tmp_path, option):
    """A name past the file system's limit (an OSError from the first look at the path)."""
    long = "a" * 5000 + (".png" if option == "--plot" else ".json")
    args = ["recommend", "--model", "7B", "--seq", "4k"] if option == "--plot" else ["predict", *FAST]
    args = [*args, option, long] if option != "--model" else ["predict", "--model", long, "--seq", "4k"]
    line = refused(tmp_path, args, "too long")
    assert len(line) < 300


def test_a_search_of_a_billion_trials_is_refused(tmp_path):
    refused(tmp_path, ["recommend", *FAST, "--trials", "1000000000"], "--trials")
