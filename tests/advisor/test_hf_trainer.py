"""`recommend --for hf`: a DeepSpeed config the Hugging Face Trainer takes, the TrainingArguments of
the layout, and the whole loop through a Trainer script of one's own (examples/hf_trainer.py)."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from advisor_process import advisor
from click.testing import CliRunner

from advisor.cli import main
from advisor.hf_trainer import fill_training_args, for_trainer, trainer_space
from advisor.launch import script_program
from advisor.recommend import make_problem
from models.architecture import load_architecture
from models.ds_config import to_ds_config
from models.profile import load_profile
from models.strategy import Strategy
from models.workload import Workload

REPO = Path(__file__).resolve().parents[2]
TINY = load_architecture("tiny-cpu")
PICKS = [Strategy(gpus=1, gpus_per_node=1, zero_stage=2, micro_batch=2, grad_accum=3, checkpoint_every=1),
         Strategy(gpus=1, gpus_per_node=1, zero_stage=3, offload_optimizer="cpu", super_offload=True, micro_batch=4)]


def trainer_check(ds_config: dict, **training_args):
    """transformers' own check of a DeepSpeed config against TrainingArguments (the Trainer runs it
    before training): the config as the Trainer fills it; ValueError naming each mismatch."""
    transformers = pytest.importorskip("transformers")
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    args = transformers.TrainingArguments(output_dir="unused", use_cpu=True, **training_args)
    checked = HfTrainerDeepSpeedConfig(json.loads(json.dumps(ds_config)))
    checked.trainer_config_process(args)
    checked.trainer_config_finalize(args, SimpleNamespace(config=SimpleNamespace(hidden_size=TINY.hidden_size)), 100)
    return checked.config, args


@pytest.mark.parametrize("strategy", PICKS, ids=lambda s: s.label())
def test_the_trainer_takes_the_config_it_refused_and_fills_in_the_layout(strategy):
    plain = to_ds_config(strategy, TINY)
    with pytest.raises(ValueError, match="mismatch"):  # the config for DeepSpeed's own flags, as users met it
        trainer_check(plain, per_device_train_batch_size=strategy.micro_batch,
                      gradient_accumulation_steps=strategy.grad_accum, bf16=True)
    config, training = for_trainer(plain, strategy, "ds.json")
    given = {k: v for k, v in training.kwargs().items() if k != "deepspeed"}
    filled, args = trainer_check(config, **given)
    assert filled["train_micro_batch_size_per_gpu"] == strategy.micro_batch
    assert filled["gradient_accumulation_steps"] == strategy.grad_accum
    assert filled["train_batch_size"] == strategy.global_batch
    assert filled["bf16"]["enabled"] is True and filled["optimizer"]["params"]["lr"] == args.learning_rate
    assert filled["gradient_clipping"] == plain["gradient_clipping"]  # SuperOffload's 0: max_grad_norm=0.0
    assert filled["zero_optimization"] == plain["zero_optimization"]  # the layout itself stays the advisor's
    assert args.gradient_checkpointing == (strategy.checkpoint_every == 1)
    assert "activation_checkpointing" not in config  # the Trainer checkpoints through torch, not DeepSpeed


def test_the_flags_read_back_as_the_same_training_arguments():
    """What {training_args} and the launch line pass is what a script's HfArgumentParser reads."""
    transformers = pytest.importorskip("transformers")
    for strategy in PICKS:
        _, training = for_trainer(to_ds_config(strategy, TINY), strategy, "ds.json")
        (args,) = transformers.HfArgumentParser(transformers.TrainingArguments).parse_args_into_dataclasses(
            args=["--output_dir", "unused", "--use_cpu", "true", *training.layout_flags()])
        for key, value in training.kwargs().items():
            if key != "deepspeed":
                assert getattr(args, key) == value, key


def test_the_trainer_space_holds_only_what_the_trainer_runs():
    """Every-K and CPU checkpointing and Ulysses are not TrainingArguments: --for hf never picks them."""
    workload, profile = Workload(TINY, 256), load_profile("h200")
    both = [make_problem(workload, profile, [2], 4, 10**6, target=t).space for t in ("deepspeed", "hf")]
    assert max(both[0].sp) == 2 and "every-2" in both[0].checkpointing and "full+cpu" in both[0].checkpointing
    assert trainer_space(both[0]) == both[1]
    points = both[1].enumerate(TINY)
    assert len(points) and set(points.sp) == {1} and set(points.checkpoint_every) == {0, 1}
    assert not points.cpu_checkpointing.any()


def test_the_placeholder_is_filled_for_the_trainer_only():
    template = "python t.py --deepspeed {ds_config} {training_args} --x {{training_args}}"
    assert fill_training_args(template, ["--bf16"]) == "python t.py --deepspeed {ds_config} --bf16 --x {{training_args}}"
    assert fill_training_args("python t.py {ds_config}", None) == "python t.py {ds_config}"
    with pytest.raises(ValueError, match="--for hf"):
        fill_training_args(template, None)


def test_recommend_for_hf_writes_the_trainer_config_and_its_training_arguments(tmp_path):
    out_path = tmp_path / "ds.json"
    result = CliRunner().invoke(main, ["recommend", "--model", "tiny-cpu", "--seq", "256", "--global-batch", "4",
                                       "--profile", "h200", "--gpus", "1", "--for", "hf", "--out-ds-config",
                                       str(out_path), "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert json.loads(out_path.read_text()) == out["ds_config"] and out["target"] == "hf"
    assert out["ds_config"]["train_micro_batch_size_per_gpu"] == "auto"
    strategy = out["recommended"]["strategy"]
    assert out["training_args"]["per_device_train_batch_size"] == strategy["micro_batch"]
    assert out["training_args"]["deepspeed"] == str(out_path)
    assert f"train.py --deepspeed {out_path} --per_device_train_batch_size {strategy['micro_batch']}" in \
        out["launch"]["deepspeed"]
    assert any("HfArgumentParser" in note for note in out["launch"]["notes"])
    plain = CliRunner().invoke(main, ["recommend", "--model", "tiny-cpu", "--seq", "256", "--profile", "h200",
                                      "--validate", "1", "--plan-only", "--script",
                                      "python t.py {ds_config} {training_args}"])
    assert plain.exit_code != 0 and "add --for hf" in plain.output and "Traceback" not in plain.output


def test_the_launch_line_starts_the_script_given():
    """A --script that starts with python runs under the launcher; one with its own launcher is the line."""
    s = Strategy(gpus=2, gpus_per_node=2)
    own = script_program("python examples/train.py --model {model} --seq {seq} --deepspeed_config {ds_config}",
                         "pick.json", s, "tiny-cpu", 256)
    assert own.line == "examples/train.py --model tiny-cpu --seq 256 --deepspeed_config pick.json"
    assert not own.own_launcher
    hf = script_program("python hf.py --deepspeed {ds_config} {training_args}", "pick.json", s, "m", 1, ["--bf16"])
    assert hf.line == "hf.py --deepspeed pick.json --bf16"
    shell = script_program("bash run.sh {gpus} {ds_config}", "pick.json", s, "m", 1)
    assert shell.own_launcher and shell.line == "bash run.sh 2 pick.json"


@pytest.mark.slow
def test_the_loop_runs_a_trainer_script_on_the_config_as_emitted(tmp_path, cpu_env):
    """examples/hf_trainer.py: a random LLaMA of tiny-cpu's widths, trained by the Trainer with
    AdvisorCallback on the CPU, from the config and TrainingArguments the advisor emits for it. The
    config's AdamW is DeepSpeed's, compiled for the CPU on first use (minutes on two cores, unless
    TORCH_EXTENSIONS_DIR keeps an earlier build)."""
    pytest.importorskip("transformers")
    script = (f"{sys.executable} {REPO / 'examples/hf_trainer.py'} --model {{model}} --seq {{seq}} "
              "--deepspeed {ds_config} {training_args} --max_steps 100000")
    done = advisor("recommend", "--model", "tiny-cpu", "--seq", "256", "--global-batch", "4", "--profile", "h200",
                   "--gpus", "1", "--search", "exhaustive", "--for", "hf", "--validate", "1", "--workdir",
                   str(tmp_path / "work"), "--script", script, "--json", cwd=tmp_path, env=cpu_env)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    (candidate,) = out["validation"]["candidates"]
    assert candidate["status"] == "ok", candidate["reason"]
    result = candidate["result"]
    assert result["measured_steps"] >= 3 and result["world_size"] == 1
    ran = json.loads((tmp_path / "work" / candidate["key"] / "ds_config.json").read_text())
    assert ran == out["ds_config"] and ran["train_batch_size"] == "auto"  # the emitted config, as it is
    micro = candidate["strategy"]["micro_batch"]
    assert f"examples/hf_trainer.py --model tiny-cpu --seq 256 --deepspeed ds_config.json " \
           f"--per_device_train_batch_size {micro}" in out["launch"]["deepspeed"]
