"""One long-lived DeepSpeed process for the calibration's engine-building work.

Why a process of its own, and one for the whole calibration: a DeepSpeed engine wants its own
process group, and importing DeepSpeed, starting that group and loading the CPU optimizer's op cost
about ten seconds. A process per step (as `advisor validate` runs them) spent some 64 s of wall
time per short step on one lent H100, mostly start-up; one worker pays it once. What a step leaves
behind in this process is undone between requests: the GPU cache is emptied, and torch's own
`linear` is put back where `deepspeed.zero.Init` replaced it for good.

The calibration (`DeepSpeedWorker`) sends one JSON request a line on the worker's stdin and reads
one reply a line from its stdout, marked with `REPLY_MARK` (DeepSpeed prints its own lines there).
Requests: `{"op": "warm", "build_ops": BOOL}` (import DeepSpeed, start its group, load or build the
optimizers' ops: begun at the calibration's start, so the builds run beside the GPU benchmarks),
`{"op": "zero3_hooks", "preset": NAME}` (calibration.microbench.zero3_hooks.measure) and
`{"op": "step", "argv": [...]}` (calibration.harness.train's arguments: one short real run). A reply
is `{"ok": true, "data": {...}}` or `{"ok": false, "error": "..."}`. A worker that dies or overruns
is killed; the next request starts another.

    python -m calibration.ds_worker        (started by DeepSpeedWorker, not by people)
"""
from __future__ import annotations

import contextlib
import json
import os
import selectors
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPLY_MARK = "@@calibration-worker@@ "


class WorkerError(RuntimeError):
    """The worker failed a request, died, or took too long."""


class DeepSpeedWorker:
    """The calibration's side: starts the worker on first use, one request at a time."""

    def __init__(self, env: dict[str, str], python: str = sys.executable):
        self._env = env
        self._python = python
        self._proc: subprocess.Popen | None = None
        self._log = tempfile.NamedTemporaryFile(prefix="calibration-worker-", suffix=".log", delete=False)
        self._begun: dict | None = None  # a request sent whose reply is not read yet

    def begin(self, message: dict) -> None:
        """Send `message` without waiting: its reply is read by `finish` (or before the next request)."""
        self._send(message)
        self._begun = message

    def finish(self, timeout_s: float) -> dict | None:
        """The begun request's `data` (None when none was begun); WorkerError as `request`."""
        if self._begun is None:
            return None
        self._begun = None
        return self._data(self._reply(self._proc, timeout_s))

    def request(self, message: dict, timeout_s: float) -> dict:
        """The worker's `data` for `message`; WorkerError with the reason (and the log's last line)."""
        if self._begun is not None:
            with contextlib.suppress(WorkerError):  # its own item reports it; this one is asked anew
                self.finish(timeout_s)
        self._send(message)
        return self._data(self._reply(self._proc, timeout_s))

    def _send(self, message: dict) -> None:
        proc = self._started()
        try:
            proc.stdin.write(json.dumps(message) + "\n")
            proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise WorkerError(self._died("it exited before the request")) from None

    @staticmethod
    def _data(reply: dict) -> dict:
        if not reply.get("ok"):
            raise WorkerError(reply.get("error") or "failed without a reason")
        return reply["data"]

    def close(self) -> None:
        """Ends the worker (its stdin closed: it leaves its group and exits), and whatever it started."""
        if self._proc is not None and self._proc.poll() is None:
            with contextlib.suppress(OSError):
                self._proc.stdin.close()
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        if self._proc is not None:
            self._kill()  # SuperOffload's CPU-optimizer processes outlive a worker that exited
        self._proc = None
        self._log.close()
        with contextlib.suppress(OSError):
            os.unlink(self._log.name)

    def _started(self) -> subprocess.Popen:
        if self._proc is None or self._proc.poll() is not None:
            env = {**os.environ, **self._env, "MASTER_PORT": str(_free_port())}
            # its own session: a kill takes SuperOffload's CPU-optimizer workers with it
            self._proc = subprocess.Popen([self._python, "-m", "calibration.ds_worker"], env=env, text=True,
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
                                          start_new_session=True)
        return self._proc

    def _reply(self, proc: subprocess.Popen | None, timeout_s: float) -> dict:
        if proc is None:
            raise WorkerError("the DeepSpeed worker was stopped before it replied")
        deadline = time.monotonic() + timeout_s
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    self._kill()
                    raise WorkerError(f"no reply within {timeout_s:.0f} s; the worker was stopped")
                if not sel.select(timeout=min(left, 1.0)):
                    continue
                line = proc.stdout.readline()
                if not line:
                    raise WorkerError(self._died("it exited"))
                if line.startswith(REPLY_MARK):
                    return json.loads(line[len(REPLY_MARK):])

    def _died(self, what: str) -> str:
        code = self._proc.wait() if self._proc else None
        self._proc = None
        last = [ln for ln in Path(self._log.name).read_text(errors="replace").splitlines() if ln.strip()]
        return f"the DeepSpeed worker failed: {what} (exit {code}): {last[-1] if last else 'no output'}"[:500]

    def _kill(self) -> None:
        """Kills the worker's session: the worker and any process it started."""
        import signal

        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, signal.SIGKILL)
        self._proc.wait()
        self._proc = None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The worker's side.

@contextlib.contextmanager
def _request_scope():
    """What one request changes in the process, undone after it: torch's `linear` (ZeRO-3's zero.Init
    replaces it for good, and a later ZeRO-0 engine or probe would time DeepSpeed's wrapper) and the
    GPU memory it cached."""
    import gc

    import torch

    linear = torch.nn.functional.linear
    try:
        yield
    finally:
        torch.nn.functional.linear = linear
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _step(argv: list[str]) -> dict:
    from calibration.harness.measure import HostMemoryPeak
    from calibration.harness.train import Timeline, parse_args, train

    result = train(parse_args(argv), HostMemoryPeak(), Timeline(since_now=True), own_process=False)
    return result.to_dict()


def _warm(build_ops: bool) -> dict:
    """DeepSpeed imported, its one-rank group started, and (on a GPU) the optimizers' ops loaded, built at
    first use: JIT builds that would otherwise fall inside the first steps."""
    started = time.perf_counter()
    import deepspeed
    import torch

    deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")
    ops = {"cpu_adam_op": "not asked for", "fused_adam_op": "not asked for"}
    if build_ops:
        from deepspeed.ops.op_builder import CPUAdamBuilder, FusedAdamBuilder

        # FusedAdam too: the first GPU-resident step built it for 40 s of its 48 on a lent H100
        for key, builder in (("cpu_adam_op", CPUAdamBuilder), ("fused_adam_op", FusedAdamBuilder)):
            try:
                builder().load()
                ops[key] = "loaded"
            except Exception as exc:  # noqa: BLE001 - the step that needs it reports its own failure
                ops[key] = f"failed: {type(exc).__name__}: {exc}"[:300]
    return {"ran": True, "deepspeed": deepspeed.__version__, **ops, "time_s": time.perf_counter() - started}


def _zero3_hooks(preset: str) -> dict:
    from calibration.microbench.zero3_hooks import measure

    return measure(preset)


def _handle(message: dict) -> dict:
    op = message.get("op")
    if op == "warm":
        return _warm(bool(message.get("build_ops")))
    with _request_scope():
        if op == "step":
            return _step(list(message["argv"]))
        if op == "zero3_hooks":
            return _zero3_hooks(str(message["preset"]))
    raise ValueError(f"unknown request {op!r}")


def serve() -> int:
    import logging

    logging.disable(logging.WARNING)  # DeepSpeed's info lines; replies are marked anyway
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            reply = {"ok": True, "data": _handle(json.loads(line))}
        except Exception as exc:  # noqa: BLE001 - every failure is the request's reply
            traceback.print_exc()
            text = str(exc).strip().splitlines()
            reply = {"ok": False, "error": f"{type(exc).__name__}: {text[0] if text else ''}"[:500]}
        sys.stdout.write(REPLY_MARK + json.dumps(reply) + "\n")
        sys.stdout.flush()
    _leave_group()
    return 0


def _leave_group() -> None:
    import torch.distributed as tdist

    if tdist.is_available() and tdist.is_initialized():
        tdist.destroy_process_group()


if __name__ == "__main__":  # the guard matters: SuperOffload's CPU workers re-import this module
    sys.exit(serve())
