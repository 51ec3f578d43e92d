"""Run candidates for real: each in its own torchrun subprocess, with a timeout, and a sweep that
goes on after failures and appends every record the moment it is measured.

A run ends as ok, oom (GPU or host memory), crash (with the error) or timeout. The subprocess
runs in its own session so that a timeout kills torchrun, its ranks and SuperOffload's
CPU-optimizer workers together. On a machine with several GPUs, single-GPU candidates run side
by side, each on its own GPU and its own share of the cores (`Slot`); a multi-GPU candidate waits
for enough free slots. Candidates start in the given order (most valuable first), so an
interrupted sweep still holds the best data, and a resumed one skips what is recorded.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterable

from calibration.harness.window import RESULT_ENV, WindowSettings
from runs.jsonl import append_record, read_records
from runs.record import Candidate, RunRecord, RunResult


@dataclass(frozen=True)
class Slot:
    """One GPU (None on a CPU-only machine) and the cores its run may use (None: all)."""

    gpu: int | None = None
    cpus: tuple[int, ...] | None = None


@dataclass(frozen=True)
class RunSettings:
    window: WindowSettings = WindowSettings()
    timeout_s: float = 600.0
    python: str = sys.executable
    env: dict = field(default_factory=dict)  # added to this process's environment
    # The host memory the sweep's runs share: a run predicted to need more is not started, and runs
    # start side by side only while their predicted host peaks fit in it together. None: not checked.
    host_memory_gib: float | None = None


def split_slots(gpus: list[int | None], cpus: list[int] | None = None) -> list[Slot]:
    """One slot per GPU, the cores divided evenly between them."""
    cpus = sorted(os.sched_getaffinity(0)) if cpus is None else cpus
    share = max(1, len(cpus) // max(1, len(gpus)))
    return [Slot(g, tuple(cpus[i * share : (i + 1) * share]) or None) for i, g in enumerate(gpus)]


class ScriptTemplateError(ValueError):
    """A --script template that cannot be filled in or split into words."""


def script_words(template: str, config_path: str | Path, gpus: int, model: str, seq: int) -> list[str]:
    """The user's script with {ds_config}, {gpus}, {model} and {seq} filled in, as words; the error
    says what is wrong (checked with stand-in values before any run, so a bad template costs no run)."""
    try:
        line = template.format(ds_config=shlex.quote(str(config_path)), gpus=gpus, model=shlex.quote(model), seq=seq)
    except (KeyError, IndexError) as exc:
        field = f"{{{exc.args[0]}}}" if isinstance(exc, KeyError) else "an empty or numbered {}"
        raise ScriptTemplateError(f"--script has {field}; it may name {{ds_config}}, {{gpus}}, {{model}} and {{seq}} "
                                  "(write {{ and }} for a brace itself)") from None
    except ValueError as exc:
        raise ScriptTemplateError(f"--script: {exc} (write {{{{ and }}}} for a brace itself)") from None
    try:
        words = shlex.split(line)
    except ValueError as exc:
        raise ScriptTemplateError(f"--script cannot be split into words: {exc}") from None
    if not words:
        raise ScriptTemplateError("--script is empty")
    return words


def script_command(c: Candidate, config_path: Path, s: RunSettings) -> list[str]:
    """The user's script filled in (`script_words`). A command that starts with `python` gets
    torchrun's launcher for several ranks; any other brings its own (`deepspeed --num_gpus {gpus} ...`).
    It reports through advisor.monitor.StepMeter (see `script_env`)."""
    words = script_words(c.script, config_path, c.gpus, c.model, c.seq_len)
    if words and Path(words[0]).name.startswith("python") and c.gpus > 1:
        words = [s.python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(c.gpus), *words[1:]]
    return words


def script_env(out_path: Path, s: RunSettings) -> dict:
    """What advisor.monitor.StepMeter reads: where to write, and the window to measure."""
    return {RESULT_ENV: str(out_path), **s.window.env()}


def harness_command(c: Candidate, config_path: Path, out_path: Path, s: RunSettings) -> list[str]:
    """torchrun for several ranks; one rank starts directly (see `single_rank_env`)."""
    model = str(Path(c.model).resolve()) if Path(c.model).is_file() else c.model  # the run's cwd differs
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(c.gpus)] if c.gpus > 1 else []
    cmd = [s.python, *launcher,
           "-m", "calibration.harness.train", "--model", model, "--seq", str(c.seq_len),
           "--ds-config", str(config_path), *s.window.harness_args(), "--out", str(out_path)]
    if c.images:
        cmd += ["--images", str(c.images)]
    if c.frames:
        cmd += ["--frames", str(c.frames)]
    if c.image_size:
        cmd += ["--image-size", str(c.image_size)]
    if c.freeze_vision:
        cmd += ["--freeze-vision"]
    cmd += ["--loss-dtype", c.loss_dtype]
    if c.sp is not None:
        cmd += ["--sp", str(c.sp)]
    if c.checkpoint_every is not None:
        cmd += ["--checkpoint-every", str(c.checkpoint_every)]
    return cmd


def single_rank_env() -> dict:
    """What torchrun would give a lone rank. Starting it directly saves torchrun's own Python
    and torch import and its shutdown, several seconds of every single-GPU run."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}


def _repo_root() -> str:
    return str(Path(__file__).resolve().parents[2])


# Runs started and not yet reaped, so that a stopped sweep can stop them: each runs in a pool thread,
# and leaving the pool waits for those threads, so a run left alive would hold the stop until it ended.
_live_runs: set[subprocess.Popen] = set()
_live_lock = threading.Lock()


def stop_live_runs() -> None:
    """Kill the session of every run still going (a Ctrl-C or SIGTERM is ending the sweep)."""
    with _live_lock:
        procs = list(_live_runs)
    for proc in procs:
        _kill_group(proc)


def run_candidate(c: Candidate, workdir: Path, settings: RunSettings = RunSettings(),
                  slots: list[Slot] | None = None) -> RunResult:
    """Run one candidate to completion or timeout; never raises for a failed run."""
    rundir = Path(workdir).resolve() / c.key()  # absolute: the run's cwd is rundir itself
    rundir.mkdir(parents=True, exist_ok=True)
    for stale in rundir.glob("result.json*"):
        stale.unlink()
    config_path, out_path, log_path = rundir / "ds_config.json", rundir / "result.json", rundir / "log.txt"
    config_path.write_text(json.dumps(c.ds_config, indent=1))
    env = {**os.environ, **settings.env}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_repo_root(), env.get("PYTHONPATH")) if p)
    if c.script:
        env.update(script_env(out_path, settings))
    if c.gpus == 1:
        env.update(single_rank_env())
    slots = slots or [Slot()]
    if len(slots) < c.gpus and slots[0].gpu is not None:
        return RunResult(status="crash", reason=f"needs {c.gpus} GPUs, {len(slots)} given to the run")
    gpus = [s.gpu for s in slots if s.gpu is not None]
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
    cpus = sorted({cpu for s in slots for cpu in (s.cpus or ())}) or None
    env["OMP_NUM_THREADS"] = str(run_threads(c, cpus, env))  # torchrun would set 1: CPUAdam would crawl
    def preexec():
        _die_with_parent()
        if cpus:
            os.sched_setaffinity(0, cpus)

    start = time.perf_counter()
    with open(log_path, "w") as log:
        command = script_command(c, config_path, settings) if c.script else harness_command(c, config_path, out_path,
                                                                                             settings)
        # A script runs where the user started the advisor, so that its relative paths hold.
        proc = subprocess.Popen(command, stdout=log,
                                stderr=subprocess.STDOUT, env=env, cwd=str(Path.cwd() if c.script else rundir),
                                start_new_session=True, preexec_fn=preexec)
        with _live_lock:
            _live_runs.add(proc)
        try:
            proc.wait(timeout=settings.timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
        finally:
            with _live_lock:
                _live_runs.discard(proc)
    wall = time.perf_counter() - start
    result = _collect(out_path, log_path, proc.returncode, timed_out, settings.timeout_s)
    return replace(result, wall_s=wall)


def run_threads(c: Candidate, cpus: list[int] | None, env: dict) -> int:
    """Threads per rank: the candidate's own, else OMP_NUM_THREADS as exported, else the run's cores
    over its ranks (what the advisor's launch lines set)."""
    asked = (c.strategy or {}).get("cpu_threads_per_rank") or 0
    if asked > 0:
        return asked
    if env.get("OMP_NUM_THREADS", "").isdigit() and int(env["OMP_NUM_THREADS"]) > 0:
        return int(env["OMP_NUM_THREADS"])
    return max(1, (len(cpus) if cpus else os.cpu_count() or 1) // c.gpus)


def _die_with_parent() -> None:
    """Linux: SIGTERM the run if the sweep dies (its own session would otherwise outlive it)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM the run's whole session, then SIGKILL what is left."""
    for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def _collect(out_path: Path, log_path: Path, returncode: int | None, timed_out: bool, timeout_s: float) -> RunResult:
    if out_path.exists() and not timed_out:
        return RunResult.read(out_path)
    if timed_out:
        return RunResult(status="timeout", reason=f"no result within {timeout_s:.0f} s; {_log_tail(log_path, 1)}")
    errors = [RunResult.read(p) for p in sorted(out_path.parent.glob(out_path.name + ".rank*.error.json"))]
    if errors:  # a rank's OOM is the cause; its peers then fail in broken collectives
        return next((e for e in errors if e.status == "oom"), errors[0])
    log = log_path.read_text(errors="replace") if log_path.exists() else ""
    if re.search(r"out of memory|OutOfMemoryError|can't allocate memory", log, re.IGNORECASE):
        return RunResult(status="oom", reason=_log_tail(log_path, 2))
    if returncode == -signal.SIGKILL or re.search(r"exitcode\s*:\s*-9\b|Signals\.SIGKILL|signal 9", log):
        return RunResult(status="oom", reason="a rank was killed by SIGKILL (host out of memory?)")
    setup = bool(re.search(HARNESS_START_FAILURES, log))
    if returncode == 0:  # a user's script that stopped on its own before StepMeter's window was measured
        return RunResult(status="crash", reason="the script ended (exit code 0) before its measured window was "
                         "complete: let it run more steps (the window lasts at least --min-window-s and two host spells)")
    return RunResult(status="crash", reason=f"exit code {returncode}; {_log_tail(log_path, 3)}", harness_error=setup)


# What a harness that could not even start prints (before it can write an error file of its own).
HARNESS_START_FAILURES = (r"No module named|can't open file|error: the following arguments are required"
                          r"|error: unrecognized arguments|ModuleNotFoundError")


class HarnessError(ValueError):
    """The harness could not start on this machine (a missing module or file): nothing about the
    candidates was learned, so nothing is recorded. A ValueError so the CLI shows it as one line."""


def _log_tail(log_path: Path, lines: int) -> str:
    if not log_path.exists():
        return "no log"
    useful = [line for line in log_path.read_text(errors="replace").splitlines()
              if line.strip() and "[WARNING]" not in line and not line.startswith(("=", "-"))]
    return " | ".join(useful[-lines:])[-600:]


def run_sweep(
    candidates: Iterable[Candidate],
    jsonl_path: Path,
    workdir: Path,
    settings: RunSettings = RunSettings(),
    slots: list[Slot] | None = None,
    predict: Callable[[Candidate], tuple[dict | None, str | None, list[str]]] | None = None,
    on_record: Callable[[RunRecord], None] | None = None,
    deadline_s: float | None = None,
    retry: tuple[str, ...] = (),
    concurrent: bool = True,
    min_run_s: float = 30.0,
    on_skip: Callable[[Candidate, str], None] | None = None,
) -> list[RunRecord]:
    """Run what is not yet in `jsonl_path`, in order, on the free slots; return the new records.

    `predict(candidate)` gives (prediction dict, profile name, notes) before each run. `on_record`
    is called with each record right after it is appended (the store). `retry` lists statuses
    to run again (e.g. ("timeout",)). No run starts later than `min_run_s` before `deadline_s`
    (seconds from now), nor runs past it; a run the deadline stops is not recorded, so the next
    sweep runs it. While the next candidate waits for more GPUs than are free, one later
    candidate that fits may use the idle ones (one per waiting candidate, so it cannot starve).
    `concurrent=False` runs one candidate at a time. With `settings.host_memory_gib`, a candidate
    predicted to need more host memory is not started nor recorded (a host OOM kill costs its minutes
    and says nothing the prediction did not): `on_skip(candidate, why)` hears of it."""
    slots = slots or [Slot()]
    on_gpus = slots[0].gpu is not None
    done = {r.key for r in read_records(jsonl_path, missing_ok=True) if r.result.status not in retry}
    pending = [c for c in candidates if c.key() not in done]
    end = None if deadline_s is None else time.monotonic() + deadline_s
    free, running, new = list(slots), {}, []
    backfilled_for = None

    def need(c: Candidate) -> int:
        return c.gpus if on_gpus else 1  # without GPUs a run's ranks share the host: one at a time

    predictions: dict[str, tuple] = {}

    def prediction(c: Candidate) -> tuple:
        if c.key() not in predictions:
            predictions[c.key()] = predict(c) if predict else (None, None, [])
        return predictions[c.key()]

    def host_gib(c: Candidate) -> float:
        """Its predicted host peak; without GPUs, what it would hold on them lives on the host too."""
        p = prediction(c)[0] or {}
        return float(p.get("peak_host_mem_gib") or 0.0) + (0.0 if on_gpus else float(p.get("allocated_gpu_mem_gib") or 0.0))

    def beyond_host(c: Candidate) -> str | None:
        limit = settings.host_memory_gib
        if limit is None or host_gib(c) <= limit:
            return None
        return f"predicted host peak {host_gib(c):.1f} GiB, this host has {limit:.1f} GiB available: not run"

    def may_start(c: Candidate) -> bool:
        host_free = (settings.host_memory_gib is None
                     or host_gib(c) + sum(host_gib(entry[0]) for entry in running.values()) <= settings.host_memory_gib)
        return len(free) >= need(c) and (not running or (concurrent and on_gpus and host_free))

    def time_left() -> float:
        return float("inf") if end is None else end - time.monotonic()

    harness_errors: list[str] = []

    def finish(c: Candidate, result: RunResult, pred):
        if result.harness_error:  # the environment failed, not the candidate: record nothing, start nothing
            harness_errors.append(f"{c.label or c.key()}: {result.reason}")
            pending.clear()
            return
        record = RunRecord.now(c, result, *pred)
        append_record(jsonl_path, record)
        if on_record:
            on_record(record)
        new.append(record)

    def launch(pool, c: Candidate):
        nonlocal free
        mine, free = free[: need(c)], free[need(c):]
        pred = prediction(c)
        budget = min(settings.timeout_s, time_left())
        future = pool.submit(run_candidate, c, workdir, replace(settings, timeout_s=budget), mine)
        running[future] = [c, mine, pred, 1, budget < settings.timeout_s]
        for entry in running.values():
            entry[3] = max(entry[3], len(running))

    def run_pending(pool):
        nonlocal backfilled_for
        while pending or running:
            while pending and time_left() > min_run_s:
                head = pending[0]
                if on_gpus and head.gpus > len(slots):
                    pending.pop(0)
                    why = f"needs {head.gpus} GPUs, the machine has {len(slots)}"
                    finish(head, RunResult(status="crash", reason=why), (None, None, []))
                elif why := beyond_host(head):
                    pending.pop(0)
                    if on_skip:
                        on_skip(head, why)
                elif may_start(head):
                    launch(pool, pending.pop(0))
                else:
                    filler = next((c for c in pending[1:] if not beyond_host(c) and may_start(c)), None)
                    if filler is None or backfilled_for == head.key():
                        break
                    pending.remove(filler)
                    launch(pool, filler)
                    backfilled_for = head.key()
            if not running:
                break  # nothing runs and nothing may start: the deadline is near
            finished, _ = wait(list(running), return_when=FIRST_COMPLETED)
            for future in finished:
                c, mine, pred, overlap, cut = running.pop(future)
                free.extend(mine)
                result = future.result()
                if cut and result.status == "timeout":
                    print(f"[cut] {c.label or c.key()}: stopped by the sweep's deadline; not recorded, runs next time",
                          file=sys.stderr)
                    continue
                finish(c, replace(result, concurrent_runs=overlap), pred)

    with ThreadPoolExecutor(max_workers=len(slots)) as pool:
        try:
            run_pending(pool)
        except BaseException:  # Ctrl-C or SIGTERM: the runs stop with the sweep, unrecorded (the next sweep runs them)
            stop_live_runs()
            raise
    if harness_errors:
        raise HarnessError(f"the harness could not start, nothing was recorded for that run "
                           f"({len(new)} recorded before): {harness_errors[0]}")
    return new


def prebuild_ops(python: str = sys.executable, gpu: bool = True, timeout_s: float = 600) -> dict:
    """Compile DeepSpeed's CPUAdam (and FusedAdam with a GPU) once, side by side, before timed
    runs: the JIT cache (~/.cache/torch_extensions) then serves every run. Returns seconds and
    the last error line per op."""
    ops = ["CPUAdamBuilder"] + (["FusedAdamBuilder"] if gpu else [])
    start, procs = time.perf_counter(), {}
    for op in ops:
        code = f"from deepspeed.ops.op_builder import {op}; {op}().load()"
        procs[op] = subprocess.Popen([python, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    report = {}
    for op, proc in procs.items():
        try:
            _, err = proc.communicate(timeout=max(1.0, timeout_s - (time.perf_counter() - start)))
        except subprocess.TimeoutExpired:
            proc.kill()
            err, proc.returncode = "timed out", -1
        report[op] = {"seconds": round(time.perf_counter() - start, 1), "ok": proc.returncode == 0,
                      "error": "" if proc.returncode == 0 else (err.strip().splitlines() or [""])[-1][:300]}
    return report
