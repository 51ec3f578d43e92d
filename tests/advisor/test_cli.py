"""The command line end to end, on the shipped cost model and gh200 profile."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from advisor.cli import main
from models.ds_config import to_ds_config
from models.profile import PROFILES_DIR
from models.strategy import Strategy


def run(*args):
    return CliRunner().invoke(main, list(args))


def strategy_of(out: dict) -> Strategy:
    return Strategy(**{k: v for k, v in out["strategy"].items() if k != "label"})


def run_json(*args):
    result = run(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)  # stdout is the JSON object alone: no progress, no logs


def one_line_error(result) -> str:
    assert result.exit_code != 0
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    return lines[0]


@pytest.fixture
def bad_profile(tmp_path):
    data = json.loads((PROFILES_DIR / "gh200.json").read_text())
    del data["gpu"]["memory_gib"]
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(data))
    return path


@pytest.fixture
def bad_model(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
                                "intermediate_size": 11008}))  # no vocab_size
    return path


@pytest.mark.parametrize("args,needle", [
    (["predict", "--model", "8B-mystery", "--seq", "4k"], "known presets: "),
    (["recommend", "--model", "8B-mystery", "--seq", "4k"], "llama-2-7b"),
    (["predict", "--model", "7B", "--seq", "32q"], "bad --seq '32q'"),
    (["recommend", "--model", "7B", "--seq", "0"], "--seq"),
    (["predict", "--model", "7B", "--seq", "4k", "--profile", "h900"], "unknown profile 'h900'"),
    (["predict", "--model", "7B", "--seq", "4k", "--gpus", "3", "--sp", "3"], "Ulysses sp=3 must divide the heads (32)"),
    (["predict", "--model", "7B", "--seq", "4k", "--gpus", "2", "--offload-param", "cpu", "--zero", "2"],
     "parameter offload needs ZeRO stage 3"),
    (["predict", "--model", "7B", "--seq", "4k", "--zero", "5"], "--zero"),
    (["predict", "--model", "7B", "--seq", "4k", "--gpus", "6"], "whole nodes"),
    (["predict", "--model", "7B", "--seq", "4k", "--images", "2"], "no vision encoder"),
    (["predict", "--model", "qwen2.5-vl-7b", "--seq", "4k", "--frames", "64"], "do not fit in a context of 4096"),
    (["recommend", "--model", "7B", "--seq", "4k", "--gpus", "four"], "bad --gpus 'four'"),
    (["recommend", "--model", "7B", "--seq", "4k", "--max-slowdown", "10"], "write 10%"),
    (["recommend", "--model", "7B", "--seq", "4k", "--tokens", "lots"], "--tokens"),
    (["recommend", "--model", "7B", "--seq", "4k", "--plot", "front.svg"], "PNG"),
    (["predict", "--model", "7B"], "Missing option '--seq'"),
    (["recommend", "--model", "7B", "--seq", "4k", "--search", "exhaustive", "--storage", "sqlite:///x.db"],
     "--storage"),
    (["recommend", "--model", "7B", "--seq", "4k", "--storage", "nosuchdb://x"], "cannot open"),
])
def test_bad_input_is_one_line(args, needle):
    assert needle in one_line_error(run(*args))


def test_malformed_files_name_the_bad_key(bad_profile, bad_model, tmp_path):
    assert "gpu.memory_gib" in one_line_error(run("predict", "--model", "7B", "--seq", "4k", "--profile", str(bad_profile)))
    assert "'vocab_size'" in one_line_error(run("recommend", "--model", str(bad_model), "--seq", "4k"))
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme"}}}))
    assert "offload_optimizer.device" in one_line_error(run("predict", "--model", "7B", "--seq", "4k", "--ds-config", str(ds)))
    assert "cannot read" in one_line_error(run("predict", "--model", "7B", "--seq", "4k", "--ds-config", str(tmp_path / "no.json")))


def test_nothing_feasible_names_the_closest_miss_with_numbers():
    line = one_line_error(run("recommend", "--model", "70B", "--seq", "1M", "--gpus", "1", "--search", "exhaustive"))
    assert "nothing feasible for llama-2-70b at 1048576 tokens on 1 GPU" in line
    assert "GiB" in line and "needs" in line and "has" in line


def test_predict_json_has_the_contract_keys():
    out = run_json("predict", "--model", "7B", "--seq", "32k", "--gpus", "4", "--zero", "3", "--checkpointing", "full")
    for key in ("step_time_s", "gpu_energy_j", "cpu_energy_j", "energy_j", "peak_gpu_mem_gib", "peak_host_mem_gib",
                "tokens_per_s", "feasible", "reasons", "breakdown"):
        assert key in out
    assert out["step_time_s"] > 0 and out["energy_j"] > 0
    assert sum(p["time_s"] for p in out["breakdown"]) == pytest.approx(out["step_time_s"], rel=1e-6)
    s = out["strategy"]
    assert (s["gpus"], s["zero_stage"], s["checkpoint_every"], s["sp"]) == (4, 3, 1, 1)
    assert s["micro_batch"] * s["grad_accum"] * 4 == 32  # default global batch: 2**20 // 32768 sequences
    assert out["tokens_per_s"] == pytest.approx(32 * 32768 / out["step_time_s"], rel=1e-6)


def test_predict_table_is_readable():
    result = run("predict", "--model", "7B", "--seq", "4k", "--zero", "2")
    assert result.exit_code == 0, result.output
    assert "step time" in result.output and "Breakdown" in result.output and "compute" in result.output
    # the peak beside what torch reports, so a user can set it against their own run's numbers
    out = run_json("predict", "--model", "7B", "--seq", "4k", "--zero", "2")
    line = next(x for x in result.output.splitlines() if "peak GPU memory" in x)
    for key in ("peak_gpu_mem_gib", "allocated_gpu_mem_gib", "reserved_gpu_mem_gib"):
        assert f"{out[key]:,.1f}" in line, key
    assert "max_memory_reserved" in line


def test_predict_reads_a_ds_config_and_flags_override_it(arch7b, tmp_path):
    s = Strategy(gpus=8, gpus_per_node=4, zero_stage=3, offload_optimizer="cpu", super_offload=True, sp=2,
                 micro_batch=2, grad_accum=4, checkpoint_every=2, cpu_checkpointing=True, overlap_comm=False)
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(to_ds_config(s, arch7b)))
    out = run_json("predict", "--model", "7B", "--seq", "32k", "--ds-config", str(path))
    assert strategy_of(out) == s  # gpus from train_batch_size / (micro * accumulation) * sp
    out = run_json("predict", "--model", "7B", "--seq", "32k", "--ds-config", str(path), "--micro-batch", "1",
                   "--checkpointing", "full")
    got = strategy_of(out)
    assert (got.micro_batch, got.grad_accum, got.checkpoint_every, got.super_offload, got.sp) == (1, 8, 1, True, 2)
    assert got.global_batch == s.global_batch
    # overlap_comm absent from a ZeRO-2 config: DeepSpeed's default follows the stage the flags set.
    path.write_text(json.dumps({"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": 1}))
    assert strategy_of(run_json("predict", "--model", "7B", "--seq", "4k", "--ds-config", str(path))).overlap_comm is False
    assert strategy_of(run_json("predict", "--model", "7B", "--seq", "4k", "--ds-config", str(path), "--zero", "3")
                       ).overlap_comm is True


def test_recommend_json_front_is_feasible_and_holds_the_pick(tmp_path):
    ds_path, png = tmp_path / "pick.json", tmp_path / "front.png"
    out = run_json("recommend", "--model", "7B", "--seq", "32k", "--trials", "120", "--out-ds-config", str(ds_path),
                   "--plot", str(png))
    assert set(out) >= {"recommended", "pareto", "ds_config", "launch"}
    labels = [p["label"] for p in out["pareto"]]
    assert out["recommended"]["label"] in labels
    assert all(p["peak_gpu_mem_gib"] <= 96 for p in out["pareto"])
    assert all(p["strategy"]["gpus"] == 4 for p in out["pareto"])  # default: one gh200 node
    times = [p["run_time_s"] for p in out["pareto"]]
    energies = [p["run_energy_j"] for p in out["pareto"]]
    assert times == sorted(times) and energies == sorted(energies, reverse=True)
    fastest = times[0]
    assert out["recommended"]["run_time_s"] <= fastest * 1.10 * (1 + 1e-9)
    assert json.loads(ds_path.read_text()) == out["ds_config"]
    assert out["ds_config"]["train_micro_batch_size_per_gpu"] == out["recommended"]["strategy"]["micro_batch"]
    assert out["launch"]["deepspeed"].startswith("OMP_NUM_THREADS=72 deepspeed --num_gpus 4 ")  # 288 cores / 4 ranks
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_recommend_table_output():
    result = run("recommend", "--model", "7B", "--seq", "32k", "--trials", "60")
    assert result.exit_code == 0, result.output
    for needle in ("Pareto front", "Recommended", "ds_config.json", "deepspeed --num_gpus 4"):
        assert needle in result.output


def test_gpu_range_searches_the_count_over_a_whole_run():
    out = run_json("recommend", "--model", "7B", "--seq", "32k", "--gpus", "4-16", "--search", "exhaustive",
                   "--tokens", "2B")
    assert out["search"]["gpu_counts"] == [4, 8, 16]
    counts = {p["strategy"]["gpus"] for p in out["pareto"]}
    assert counts <= {4, 8, 16}
    for p in out["pareto"]:
        tokens_per_step = p["global_batch"] * 32768
        assert p["steps"] == -(-2 * 10**9 // tokens_per_step)
        assert p["run_energy_j"] == pytest.approx(p["energy_j"] * p["steps"])


def test_predict_and_recommend_import_neither_torch_nor_deepspeed(tmp_path):
    code = (
        "import sys\n"
        "from advisor.cli import main\n"
        "for args in (['predict', '--model', '7B', '--seq', '4k', '--json'],\n"
        "             ['recommend', '--model', '7B', '--seq', '4k', '--trials', '20', '--json',\n"
        f"              '--plot', {str(tmp_path / 'p.png')!r}]):\n"
        "    try:\n"
        "        main(args)\n"
        "    except SystemExit as e:\n"
        "        assert e.code == 0, e.code\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'deepspeed'))\n"
        "print('LOADED', bad)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "LOADED []" in proc.stdout


def test_lazy_commands_do_not_break_the_cli():
    result = run("--help")
    assert result.exit_code == 0
    assert "predict" in result.output and "recommend" in result.output


def test_storage_resumes_a_study_from_the_command_line(tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    args = ("recommend", "--model", "7B", "--seq", "32k", "--trials", "40", "--storage", url)
    first = run_json(*args)
    second = run_json(*args)
    assert first["search"]["study_name"] == second["search"]["study_name"]
    assert second["search"]["distinct_strategies"] > first["search"]["distinct_strategies"]
    import optuna

    assert len(optuna.load_study(study_name=second["search"]["study_name"], storage=url).trials) == 80


@pytest.mark.parametrize("model, seq, workload, search", [
    ("7B", "32k", [], []),
    ("13B", "4k", [], ["--gpus", "8"]),
    ("qwen2.5-vl-7b", "32k", ["--frames", "64"], []),
])
def test_every_pick_and_alternative_is_predicted_again_by_its_flags(model, seq, workload, search):
    out = run_json("recommend", "--model", model, "--seq", seq, *workload, *search, "--search", "exhaustive")
    assert out["alternatives"], "the best of each family is listed"
    for point in [out["recommended"], *out["pareto"]]:
        again = run_json("predict", "--model", model, "--seq", seq, *workload, *point["predict_flags"])
        assert strategy_of(again) == Strategy(**point["strategy"])
        assert again["step_time_s"] == pytest.approx(point["step_time_s"], rel=1e-12)
        assert again["energy_j"] == pytest.approx(point["energy_j"], rel=1e-12)
        assert again["peak_gpu_mem_gib"] == pytest.approx(point["peak_gpu_mem_gib"], rel=1e-12)


def test_a_resumed_study_says_so(tmp_path):
    db = f"sqlite:///{tmp_path / 'study.db'}"
    first = run_json("recommend", "--model", "tiny-cpu", "--seq", "256", "--trials", "40", "--storage", db)
    again = run_json("recommend", "--model", "tiny-cpu", "--seq", "256", "--trials", "40", "--storage", db)
    assert first["search"]["resumed"] is False and first["search"]["trials_total"] == 40
    assert again["search"]["resumed"] is True and again["search"]["trials_before"] == 40
    assert again["search"]["trials_total"] == 80 and again["search"]["evaluations"] == 40


def test_the_table_says_how_far_to_trust_the_profile_and_names_the_families():
    result = run("recommend", "--model", "7B", "--seq", "32k", "--trials", "60")
    assert "gh200: derived from another machine's measurements by datasheet ratios, not measured" in result.output
    assert "Best of each family" in result.output
    assert "h200: measured on NVIDIA H200 and fitted to real runs" in run(
        "predict", "--model", "7B", "--seq", "4k", "--profile", "h200").output


def test_version():
    result = run("--version")
    assert result.exit_code == 0 and result.output.startswith("advisor, version ")


def test_the_default_search_is_exact_on_a_small_space_and_optuna_when_asked_for_trials():
    small = run_json("recommend", "--model", "7B", "--seq", "4k")
    assert small["search"]["method"] == "exhaustive"
    assert small["search"]["evaluations"] == small["search"]["distinct_strategies"]
    assert run_json("recommend", "--model", "7B", "--seq", "4k", "--trials", "20")["search"]["method"] == "optuna"


def test_an_unknown_profile_lists_the_shipped_profiles_not_their_companion_files():
    result = CliRunner().invoke(main, ["predict", "--model", "7B", "--seq", "4k", "--profile", "h900"])
    assert result.exit_code != 0
    assert "shipped profiles: gh200, h100, h200" in result.output
    assert "fit-report" not in result.output and "band" not in result.output


def test_predict_bands_the_peak_by_the_pools_band_and_notes_a_band_past_the_gpu(tmp_path):
    """A band whose pool may reach 1.65x the predicted: a step predicted at 100 GiB of a 141 GiB H200
    fits, and predict says its pool may not; the JSON carries the peak's band."""
    import math

    from models.band import Band, band_path
    from models.profile import load_profile

    profile = load_profile("h200")
    mine = tmp_path / "mine.json"
    mine.write_text(profile.to_json())
    ratios = [-0.05, 0.0, 0.05] * 20
    band = Band.from_residuals({"step_time_s": ratios, "gpu_energy_j": ratios,
                                "reserved_gpu_mem_gib": [-0.1, 0.0, 0.5] * 20}, profile.to_json(), source="test")
    band_path(mine).write_text(band.to_json())
    args = ("predict", "--model", "qwen2.5-1.5b", "--seq", "32k", "--gpus", "1", "--zero", "2", "--checkpointing", "full",
            "--profile", str(mine))
    out = run_json(*args)
    outside = out["peak_gpu_mem_gib"] - out["reserved_gpu_mem_gib"]
    assert out["peak_gpu_mem_gib_band"] == pytest.approx([out["reserved_gpu_mem_gib"] * math.exp(-0.1) + outside,
                                                          out["reserved_gpu_mem_gib"] * math.exp(0.5) + outside])
    assert out["feasible"] and out["peak_gpu_mem_gib_band"][1] > profile.gpu.memory_gib.value
    result = run(*args)
    assert result.exit_code == 0, result.output
    assert "torch's pool may take up to" in result.output and "90% band" in result.output


def test_validate_leaves_out_a_candidate_past_this_hosts_memory_and_says_so(tmp_path, monkeypatch):
    import calibration.environment as environment
    import calibration.harness.runner as runner
    from runs.record import RunResult

    started = []

    def fake_run(c, workdir, settings, slots):
        started.append(c.label)
        return RunResult(status="ok", step_time_s=0.5, gpu_energy_j=100.0)

    monkeypatch.setattr(runner, "run_candidate", fake_run)
    monkeypatch.setattr(environment, "host_memory_available_gib", lambda: 100.0)
    sweep = tmp_path / "sweep.jsonl"
    sweep.write_text("\n".join(json.dumps(line) for line in (
        {"model": "qwen2.5-7b", "seq": 4096, "label": "7b offload",
         "strategy": {"zero_stage": 2, "offload_optimizer": "cpu", "checkpoint_every": 1}},
        {"model": "qwen2.5-0.5b", "seq": 2048, "label": "small", "strategy": {"zero_stage": 1}})) + "\n")
    out = run_json("validate", "--sweep", str(sweep), "--profile", "h200", "--store", str(tmp_path / "runs.db"),
                   "--workdir", str(tmp_path / "work"), "--no-prebuild")
    assert started == ["small"]
    assert [b["label"] for b in out["beyond_host_memory"]] == ["7b offload"]
    assert "100.0 GiB available" in out["beyond_host_memory"][0]["reason"] and out["not_run"] == 0
