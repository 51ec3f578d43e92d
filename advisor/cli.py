"""`advisor`: the command line. `predict` one strategy, `recommend` the best of many.

Imports stay inside the commands so `advisor recommend` starts fast and never imports
torch or DeepSpeed; calibrate, validate and fit live in their own modules, loaded only
when called (and left out of the list when their module is not installed).
Users' mistakes end in one line and a non-zero exit, never a traceback: our errors' messages, and
a path the system refuses (a name too long, a folder where a file should be) with the system's reason.
"""
from __future__ import annotations

import importlib
import importlib.util
import json
import os
import signal
import sys
import time
import warnings

import click

from advisor.extras import is_gpu_module, missing_line
from advisor.inputs import (
    FiniteFloatRange,
    InputError,
    check_whole_nodes,
    counts_within_run,
    default_global_batch,
    parse_count,
    parse_fraction,
    parse_gpus,
    parse_seq,
    parse_sequences,
)
from advisor.outputs import output_file, output_folder
from advisor.rounds import DEFAULT_ROUNDS, repeat_margin
from advisor.search import DEFAULT_TRIALS, DEFAULT_TRIALS_GPU_RANGE, MAX_TRIALS
from models.limits import MAX_COUNT, MAX_GPUS, MAX_PER_SAMPLE

DEFAULT_TOKENS = "1B"
LAZY_COMMANDS = {
    "calibrate": "advisor.cmd_calibrate:calibrate",
    "wheelhouse": "advisor.cmd_calibrate:wheelhouse",
    "validate": "advisor.cmd_validate:validate",
    "fit": "advisor.cmd_fit:fit",
    "report": "advisor.cmd_fit:report",
}
_OUR_PACKAGES = ("models", "advisor", "calibration", "runs")


class OneLineUsageError(click.ClickException):
    """A usage mistake shown as one line (click's own shows the usage block first)."""

    exit_code = 2


def _is_user_error(exc: BaseException) -> bool:
    """Our ValueError subclasses (ProfileError, ModelConfigError, ...) carry user-facing messages."""
    return (isinstance(exc, ValueError) and type(exc) is not ValueError
            and type(exc).__module__.split(".")[0] in _OUR_PACKAGES)


class AdvisorGroup(click.Group):
    def list_commands(self, ctx):
        lazy = [n for n, target in LAZY_COMMANDS.items() if _module_exists(target.split(":")[0])]
        return sorted(set(super().list_commands(ctx)) | set(lazy))

    def get_command(self, ctx, name):
        command = super().get_command(ctx, name)
        if command is not None or name not in LAZY_COMMANDS:
            return command
        module, attr = LAZY_COMMANDS[name].split(":")
        if not _module_exists(module):
            return None
        try:
            return getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError):
            return None

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:
            where = f" (see advisor {ctx.invoked_subcommand} --help)" if ctx.invoked_subcommand else ""
            raise OneLineUsageError(exc.format_message().replace("\n", " ") + where) from None
        except ModuleNotFoundError as exc:
            if is_gpu_module(exc.name):
                raise click.ClickException(missing_line(ctx.invoked_subcommand, exc.name)) from None
            raise
        except OSError as exc:
            if exc.filename is None:  # not a path's: standard output's, which run() reports
                raise
            from models.input_file import shown_path

            raise click.ClickException(f"cannot use {shown_path(exc.filename)}: {exc.strerror}") from None
        except Exception as exc:
            if _is_user_error(exc):
                raise click.ClickException(" ".join(str(exc).split())) from None
            raise


def _module_exists(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:
        return False


@click.group(cls=AdvisorGroup)
@click.version_option(package_name="energy-advisor", prog_name="advisor")
def main():
    """Energy-aware DeepSpeed configuration advisor: predict step time, energy and memory of
    DeepSpeed strategies from a hardware profile, and recommend one."""
    warnings.showwarning = _show_warning


_python_showwarning = warnings.showwarning


def _show_warning(message, category, filename, lineno, file=None, line=None):
    """Our warnings (a run file's torn last line) as one line for people; others as Python shows them."""
    if category.__module__.split(".")[0] in _OUR_PACKAGES:
        click.echo(f"warning: {message}", err=True)
    else:
        _python_showwarning(message, category, filename, lineno, file, line)


def workload_options(f):
    """Options both commands share: what is trained, and on which hardware profile."""
    for decorator in reversed([
        click.option("--model", required=True, help="Preset (7B, llama-2-13b, qwen2.5-vl-7b, ...) or a config.json path."),
        click.option("--seq", "seq_text", required=True,
                     help="Context length in tokens; k and M are binary, as contexts are quoted: 4k = 4096, "
                          "32k = 32768, 1M = 1048576."),
        click.option("--profile", default="gh200", show_default=True, help="Shipped profile name or profile JSON path."),
        click.option("--global-batch", "global_batch_text", default=None,
                     help="Sequences per optimizer step; k is decimal, as counts are: 2k = 2000 (unlike --seq). "
                          "Default: max(1, 2**20 // seq), about 1M tokens."),
        click.option("--images", type=click.IntRange(0, MAX_PER_SAMPLE), default=0, help="Images per sample (vision models)."),
        click.option("--frames", type=click.IntRange(0, MAX_PER_SAMPLE), default=0, help="Video frames per sample (vision models)."),
        click.option("--image-size", type=click.IntRange(1, MAX_PER_SAMPLE), default=None, help="Image side in pixels (default: the model's)."),
        click.option("--freeze-vision/--train-vision", default=True, show_default=True,
                     help="Keep the vision encoder frozen, or train it too."),
        click.option("--loss-dtype", type=click.Choice(["fp32", "bf16"]), default="fp32", show_default=True,
                     help="The cross-entropy's dtype: fp32 casts the logits first, as Hugging Face does."),
        click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables."),
    ]):
        f = decorator(f)
    return f


def _load(model, seq_text, profile, images, frames, image_size, freeze_vision, loss_dtype):
    from models.architecture import load_architecture
    from models.profile import load_profile
    from models.workload import Workload

    seq = parse_seq(seq_text)
    arch = load_architecture(model)
    workload = Workload(arch, seq, images=images, frames=frames, image_size=image_size, train_vision=not freeze_vision,
                        loss_dtype=loss_dtype)
    return arch, workload, load_profile(profile)


def _global_batch(text, seq) -> int:
    return parse_sequences(text, "--global-batch") if text else default_global_batch(seq)


@main.command()
@workload_options
@click.option("--gpus", type=click.IntRange(1, MAX_GPUS), default=None,
              help="GPU count (default: from --ds-config's batch sizes, else one node of the profile).")
@click.option("--sp", type=click.IntRange(1, MAX_COUNT), default=None, help="Ulysses sequence-parallel degree.")
@click.option("--checkpointing", default=None,
              help="Activation checkpointing: exactly none, full or every-K (every K-th layer, K >= 1), each "
                   "optionally +cpu (checkpoints kept in host memory), e.g. every-4+cpu; case-insensitive, "
                   "nothing else accepted.")
@click.option("--ds-config", "ds_config_path", type=click.Path(dir_okay=False), default=None,
              help="Read the strategy from an existing DeepSpeed config; explicit flags override it.")
@click.option("--zero", type=click.IntRange(0, 3), default=None, help="ZeRO stage.")
@click.option("--offload-optimizer", type=click.Choice(["none", "cpu"]), default=None,
              help="Keep the optimizer state (and its step) on the GPU, or offload it to the host CPU (ZeRO 1-3).")
@click.option("--offload-ratio", type=FiniteFloatRange(0, 1, min_open=True), default=None,
              help="Share of the optimizer state offloaded (ZeRO-3 with --offload-optimizer cpu; default 1).")
@click.option("--super-offload/--no-super-offload", default=None,
              help="SuperOffload: the asynchronous CPU optimizer (ZeRO-3 with --offload-optimizer cpu).")
@click.option("--offload-param", type=click.Choice(["none", "cpu"]), default=None,
              help="Keep the bf16 parameters on the host between uses (ZeRO-3 with optimizer offload).")
@click.option("--micro-batch", type=click.IntRange(1, MAX_COUNT), default=None, help="Sequences per GPU per micro-step.")
@click.option("--grad-accum", type=click.IntRange(1, MAX_COUNT), default=None,
              help="Micro-steps per optimizer step (default: from the global batch).")
@click.option("--overlap-comm/--no-overlap-comm", default=None,
              help="DeepSpeed's overlap_comm (default: on for ZeRO-3 only, as DeepSpeed).")
@click.option("--cpu-threads-per-rank", "threads", type=click.IntRange(1, MAX_PER_SAMPLE), default=None,
              help="CPU threads of each rank (OMP_NUM_THREADS; torchrun sets 1 for several ranks). Default: the "
                   "profile's host cores / ranks on a node, what advisor's launch lines set.")
def predict(model, seq_text, profile, global_batch_text, images, frames, image_size, freeze_vision, loss_dtype, as_json,
            gpus, sp, checkpointing, ds_config_path, zero, offload_optimizer, offload_ratio, super_offload,
            offload_param, micro_batch, grad_accum, overlap_comm, threads):
    """Predict one optimizer step of one strategy: time, energy (GPU and CPU), memory."""
    from dataclasses import asdict

    from models.ds_config import DsSettings, load_ds_config
    from advisor.strategy_flags import StrategyFlags, strategy_from_inputs
    from models.predict import predict as predict_one
    from models.term_basis import network_refusal

    arch, workload, prof = _load(model, seq_text, profile, images, frames, image_size, freeze_vision, loss_dtype)
    settings = load_ds_config(ds_config_path, arch) if ds_config_path else DsSettings({}, None)
    for warning in settings.warnings:
        click.echo(f"warning: {warning}", err=True)
    flags = StrategyFlags(gpus=gpus, zero_stage=zero, offload_optimizer=offload_optimizer, offload_ratio=offload_ratio,
                          super_offload=super_offload, offload_param=offload_param, checkpointing=checkpointing,
                          sp=sp, micro_batch=micro_batch, grad_accum=grad_accum, overlap_comm=overlap_comm,
                          cpu_threads_per_rank=threads)
    strategy = strategy_from_inputs(flags, settings, arch, int(prof.gpus_per_node.value),
                                    _global_batch(global_batch_text, workload.seq_len))
    refusal = network_refusal(prof, strategy.gpus, strategy.gpus_per_node)
    if refusal:
        raise InputError(refusal)
    pred = predict_one(workload, strategy, prof)
    from advisor.bands import band_fields, pool_band_note, profile_band
    from advisor.host_check import host_bound_notes
    from advisor.model_notes import head_dim_notes
    from advisor.recommend import thread_warnings

    band, why_not = profile_band(profile, prof)
    bands = band_fields(band, pred.step_time_s, pred.energy_j, pred.host_share, pred.reserved_gpu_mem_gib,
                        pred.peak_gpu_mem_gib)
    pool_note = pool_band_note(bands["peak_gpu_mem_gib_band"], prof.gpu.memory_gib.value,
                               band.level if band else None) if pred.feasible else None
    from models.strategy import StrategyBatch
    from models.term_basis import reliance

    unmeasured = reliance(workload, StrategyBatch.from_strategies([strategy]), prof)[0]
    unmeasured_note = ([f"note: this step rests on terms profile '{prof.name}' did not measure: "
                        + "; ".join(r.describe() for r in unmeasured)] if unmeasured else [])
    for warning in (unmeasured_note + thread_warnings(strategy, prof) + host_bound_notes(pred)
                    + head_dim_notes(arch, prof) + ([pool_note] if pool_note else [])):
        click.echo(warning, err=True)
    if as_json:
        out = pred.to_dict()
        out["rests_on_unmeasured"] = [r.to_dict() for r in unmeasured]
        out.setdefault("strategy", asdict(strategy))
        out["global_batch"] = strategy.global_batch
        out["tokens_per_step"] = strategy.global_batch * workload.seq_len
        out["profile_trust"] = prof.trust()
        out.update(bands, band_level=band.level if band else None, band_note=why_not or None)
        click.echo(json.dumps(out))
        return
    from advisor.render import console, show_prediction

    show_prediction(console(), pred, strategy, f"{arch.name} at {workload.seq_len} tokens on {prof.describe()}",
                    prof.trust(), bands, band.level if band else None, why_not)


@main.command()
@workload_options
@click.option("--gpus", "gpus_text", default=None,
              help="GPU count (8) or range to search (4-64). Default: one node of the profile.")
@click.option("--objective", type=click.Choice(["energy", "time", "edp"]), default="energy", show_default=True)
@click.option("--max-slowdown", "slowdown_text", default="10%", show_default=True,
              help="How much slower than the fastest feasible strategy the pick may be.")
@click.option("--search", "method", type=click.Choice(["auto", "optuna", "exhaustive"]), default="auto",
              show_default=True,
              help="auto: predict every strategy when the space holds at most 50,000 (exact, under a second), "
                   "else Optuna; Optuna whenever --trials or --storage is given.")
@click.option("--trials", type=click.IntRange(1, MAX_TRIALS), default=None,
              help=f"Optuna trials in this run (a resumed study adds to its earlier ones). Default: {DEFAULT_TRIALS}, "
                   f"{DEFAULT_TRIALS_GPU_RANGE} when --gpus is a range.")
@click.option("--storage", default=None, help="Optuna storage URL: sqlite:///study.db resumes, postgresql://... shares.")
@click.option("--seed", type=click.IntRange(0, 2**32 - 1), default=None,
              help="Sampler seed (default 0; random with --storage).")
@click.option("--tokens", "tokens_text", default=DEFAULT_TOKENS, show_default=True,
              help="Tokens of the whole run (decimal: 1B = 1e9); run time and energy cover them.")
@click.option("--cpu-threads-per-rank", "threads", type=click.IntRange(1, MAX_PER_SAMPLE), default=None,
              help="CPU threads of each rank (OMP_NUM_THREADS); the launch line sets it. Default: the "
                   "profile's host cores / ranks on a node.")
@click.option("--memory-margin", "margin_text", default="5%", show_default=True,
              help="Share of GPU memory every strategy must leave free, for the prediction's error.")
@click.option("--out-ds-config", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Write the pick's DeepSpeed config here.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Write the Pareto plot (PNG) here.")
@click.option("--validate", "validate_k", type=click.IntRange(min=1), default=None,
              help="Measure up to K candidates the model cannot tell apart on this machine's GPUs, and pick by "
                   "measurement (the pick, the fastest, those whose band overlaps the pick's, the best of each family).")
@click.option("--budget", "budget_s", type=FiniteFloatRange(min=1), default=None,
              help="With --validate: seconds for this whole command (the search and op builds included): no run "
                   "starts or runs past it.")
@click.option("--refit", is_flag=True,
              help="With --validate: refit the profile on every stored run; written beside it, never over it.")
@click.option("--script", default=None,
              help="With --validate: your training script instead of the built-in model, e.g. \"python train.py "
                   "--deepspeed_config {ds_config}\" (also {gpus}, {model}, {seq}, and with --for hf "
                   "{training_args}); it reports through advisor.monitor (StepMeter, or AdvisorCallback for the Trainer).")
@click.option("--workdir", default=None,
              help="With --validate: configs, logs, results (default: ~/.cache/energy-advisor/validate-runs).")
@click.option("--store", "store_path", type=click.Path(dir_okay=False), default=None,
              help="With --validate: SQLite run store (default: ~/.cache/energy-advisor/runs.db).")
@click.option("--plan-only", is_flag=True, help="With --validate: show the candidates and their predictions; run nothing.")
@click.option("--rounds", type=click.IntRange(1, 10), default=None,
              help=f"With --validate: rounds of measurement for the candidates the first round cannot rank; later "
                   f"rounds run them again, interleaved, and each is judged on the mean of its rounds (default "
                   f"{DEFAULT_ROUNDS}; 1: one run each).")
@click.option("--tie-margin", "tie_margin_text", default=None,
              help="With --validate: a candidate measured within this of the pick's figure runs again (default: "
                   "how far one run each of two equal candidates comes apart on one host, "
                   f"{repeat_margin('gpu_bound', 'gpu_bound'):.0%} for two GPU-bound steps, "
                   f"{repeat_margin('host_bound', 'host_bound'):.0%} for two host-bound ones).")
@click.option("--retry", multiple=True, type=click.Choice(["oom", "crash", "timeout"]),
              help="With --validate: run again the candidates stored with this status (say, a crash since fixed).")
@click.option("--for", "target", type=click.Choice(["deepspeed", "hf"]), default="deepspeed", show_default=True,
              help="What runs the config: deepspeed (its own flags), or hf, the Hugging Face Trainer: \"auto\" where "
                   "TrainingArguments sets the value, the TrainingArguments of the layout, and {training_args} in "
                   "--script.")
def recommend(model, seq_text, profile, global_batch_text, images, frames, image_size, freeze_vision, loss_dtype,
              as_json, gpus_text, objective, slowdown_text, method, trials, storage, seed, tokens_text, threads,
              margin_text, out_ds_config, plot_path, validate_k, budget_s, refit, script, workdir, store_path,
              plan_only, rounds, tie_margin_text, retry, target):
    """Search ZeRO stage, offload, checkpointing, sp and micro-batch; print the Pareto front,
    the pick, its DeepSpeed config and launch line. With --validate K, measure the closest
    candidates and pick by measurement."""
    started = time.monotonic()
    from advisor.loop import LoopSettings
    from advisor.recommend import RecommendRequest, recommend_run
    from advisor.space import widest_sp

    loop_only = {"--budget": budget_s, "--refit": refit, "--script": script, "--store": store_path,
                 "--plan-only": plan_only, "--rounds": rounds, "--tie-margin": tie_margin_text, "--retry": retry}
    if validate_k is None and any(loop_only.values()):
        given = ", ".join(k for k, v in loop_only.items() if v)
        raise InputError(f"{given} belongs to --validate K (measure K candidates): add it, or leave {given} out")
    if script is not None and "{ds_config}" not in script:
        raise InputError("--script must pass each candidate's config: put {ds_config} where your script takes it")
    if script is not None:
        from advisor.hf_trainer import fill_training_args
        from calibration.harness.runner import script_words

        script_words(fill_training_args(script, [] if target == "hf" else None), "ds_config.json", 1, model or "model",
                     1)  # a template that cannot be filled fails now

    if method == "exhaustive" and storage:
        raise InputError("--storage holds Optuna studies; --search exhaustive keeps nothing to resume")
    if method == "auto" and (storage or trials is not None):
        method = "optuna"
    slowdown = parse_fraction(slowdown_text)
    margin = parse_fraction(margin_text, "--memory-margin")
    if margin >= 1:
        raise InputError(f"bad --memory-margin '{margin_text}': must be under 100%")
    tokens = parse_count(tokens_text, "--tokens")
    if plot_path and not plot_path.lower().endswith(".png"):
        raise InputError(f"bad --plot '{plot_path}': the plot is a PNG, name it FILE.png")
    from models.profile import profile_path

    for option, path in (("--out-ds-config", out_ds_config), ("--plot", plot_path)):
        if path:  # before the search, so its result is not lost
            output_file(path, option, reads=(model, profile_path(profile)))
    if validate_k is not None and not plan_only and workdir:
        output_folder(workdir, "--workdir")
    arch, workload, prof = _load(model, seq_text, profile, images, frames, image_size, freeze_vision, loss_dtype)
    per_node = int(prof.gpus_per_node.value)
    gpu_range = parse_gpus(gpus_text or per_node)
    if gpu_range.fixed:
        check_whole_nodes(gpu_range.low, per_node)
    counts = gpu_range.counts(per_node) if not gpu_range.fixed else [gpu_range.low]
    counts, dropped = counts_within_run(counts, lambda gpus: widest_sp(arch, gpus, per_node), workload.seq_len,
                                        tokens)
    from models.term_basis import network_refusal

    refusal = network_refusal(prof, max(counts), per_node)
    if refusal:
        raise InputError(refusal)
    tie_margin = None if tie_margin_text is None else parse_fraction(tie_margin_text, "--tie-margin")
    loop = None if validate_k is None else LoopSettings(
        k=validate_k, workdir=workdir, store=store_path, jsonl=None, budget_s=budget_s, script=script, refit=refit,
        plan_only=plan_only, rounds=rounds or DEFAULT_ROUNDS, tie_margin=tie_margin, retry=tuple(retry),
        started_monotonic_s=started, target=target)
    recommend_run(RecommendRequest(
        model=model, workload=workload, profile=prof, profile_name=profile, gpu_counts=counts,
        global_batch=_global_batch(global_batch_text, workload.seq_len), tokens=tokens, objective=objective,
        max_slowdown=slowdown, method=method, storage=storage,
        trials=trials or (DEFAULT_TRIALS if gpu_range.fixed else DEFAULT_TRIALS_GPU_RANGE),
        seed=(None if storage else 0) if seed is None else seed,
        out_ds_config=out_ds_config, plot_path=plot_path, as_json=as_json, notes=tuple(dropped),
        cpu_threads_per_rank=threads or 0, memory_margin=margin, loop=loop, target=target,
    ))


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def run():
    """The `advisor` command. A stop from `kill` or a scheduler (SIGTERM) ends it as Ctrl-C does:
    joblib then stops a refit's worker processes, which a plain SIGTERM left running (two of them
    still busy after the command had gone, 2026-12-02).

    A command whose output cannot be written fails in one line: a closed standard output (`>&-`)
    before any work (it had exited 0 having printed nothing), a full one (`> /dev/full`) when it
    is written (an OSError traceback)."""
    signal.signal(signal.SIGTERM, _interrupt)
    if sys.stdout is None:
        _fail("standard output is closed; give the command somewhere to print (a file, a pipe, /dev/null)")
    sys.stdout = stdout = _WatchedOutput(sys.stdout)
    try:
        try:
            main()
        finally:
            sys.stdout.flush()
    except OSError as exc:
        if stdout.failed is None:
            raise
        os.dup2(os.open(os.devnull, os.O_WRONLY), stdout.fileno())  # so the interpreter's flush at exit passes
        _fail(f"cannot write to standard output ({exc.strerror or exc})")


class _WatchedOutput:
    """Standard output as it was, remembering a write to it that failed: an OSError escaping a command
    is then known to be the output's own (a full disk), not a bug."""

    def __init__(self, stream):
        self._stream = stream
        self.failed: OSError | None = None

    def write(self, text):
        try:
            return self._stream.write(text)
        except OSError as exc:
            self.failed = exc
            raise

    def flush(self):
        try:
            return self._stream.flush()
        except OSError as exc:
            self.failed = exc
            raise

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _fail(message: str) -> None:
    if sys.stderr is not None:
        print(f"Error: {message}", file=sys.stderr)
    raise SystemExit(1)


if __name__ == "__main__":
    run()
