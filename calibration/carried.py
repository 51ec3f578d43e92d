"""The terms a calibration does not measure, carried from a reference profile and rescaled by what it did.

Microbenchmarks time kernels, links and the CPU optimizer; DeepSpeed's own overheads (hooks, the
offload code paths, SuperOffload's worker) show only in real steps, and memory's fragmentation only in
real pools. Left at a placeholder of zero they are free, and a search picks the free strategy. So each
is taken from a reference profile fitted to real runs (`REFERENCE_PROFILE`, or `--fill-from`), scaled
by what drives it, as measured on both hosts, and says so in its source:

- the host's issue speed (the host probe, `host.issue_per_layer`), for Python on one thread: the fixed
  step and micro-step costs and the synchronous offload path's serial part. The five issue constants
  (`layer_pass`, the hooks, the per-tensor steps) are carried with the probe reading they were fitted at
  (`overheads.issue_fitted_at_per_layer`), so the model scales them itself (`host_issue_scale`);
- the CPU optimizer's rate at the default threads per rank, for the offload work that runs on the
  rank's threads (`offload_step_per_gparam`, `super_offload_step_per_gparam`);
- nothing, for shares and efficiencies (`zero3_host_serial`, `compute_efficiency`, the pool's shares),
  carried as they are.

Carried is not measured: `models.term_basis` reads these sources as `carried`, recommend flags a pick
resting on one, and the validation loop measures such picks first.
"""
from __future__ import annotations

from models.profile import HardwareProfile, HostSpec

REFERENCE_PROFILE = "h200"  # the shipped profile fitted to the most real runs

ISSUE_SCALED_IN_MODEL = ("layer_pass", "zero3_module_pass", "zero12_grad_hook", "zero12_step_per_tensor",
                         "step_per_tensor")
SCALED_BY_ISSUE = ("step", "micro_step", "offload_step_serial_per_gparam", "zero3_offload_step_per_tensor")
SCALED_BY_CPU_RATE = ("offload_step_per_gparam", "super_offload_step_per_gparam")
AS_THEY_ARE = ("zero3_host_serial", "compute_efficiency")
MEMORY_SHARES = ("fragmentation", "fragmentation_checkpointed", "fragmentation_offload",
                 "fragmentation_offload_checkpointed", "offload_start_pool", "collective_pool", "host_process_per_rank")


def _q(value: float, unit: str, source: str) -> dict:
    return {"value": float(value), "unit": unit, "source": source}


def _cpu_rate_at_default_threads(host: HostSpec, gpus_per_node: float):
    return float(host.cpu_rate_on_threads(host.default_threads_per_rank(gpus_per_node), gpus_per_node))


def issue_ratio(host: HostSpec, ref: HardwareProfile) -> float | None:
    """How much slower this host issues Python than the hosts the reference's constants were fitted
    on (probe over probe); None where either probe is missing."""
    fitted_at = ref.overheads.issue_fitted_at_per_layer or ref.host.issue_per_layer
    if host.issue_per_layer is None or fitted_at is None or not fitted_at.value > 0:
        return None
    return host.issue_per_layer.value / fitted_at.value


def carried_overheads(host: HostSpec, gpus_per_node: float, ref: HardwareProfile) -> dict:
    """The `overheads` section for a profile of `host`: each term the reference's, rescaled (see the
    module's docstring), its source starting "carried from profile ..."."""
    ov = ref.overheads
    origin = f"carried from profile '{ref.name}' ({ref.provenance.kind}, {ref.provenance.date})"
    issue = issue_ratio(host, ref)
    here_rate = _cpu_rate_at_default_threads(host, gpus_per_node)
    ref_rate = _cpu_rate_at_default_threads(ref.host, ref.gpus_per_node.value)
    cpu_ratio = ref_rate / here_rate
    out = {}
    for name in ISSUE_SCALED_IN_MODEL:
        q = getattr(ov, name)
        how = ("scaled in the model by this host's probe over overheads.issue_fitted_at_per_layer" if issue
               else "not rescaled: no host probe here")
        out[name] = _q(q.value, q.unit, f"{origin}, {how}: {q.source}")
    for name in SCALED_BY_ISSUE:
        q = getattr(ov, name)
        factor, how = ((issue, f"x {issue:.3g}, this host's issue time over the one it was fitted at") if issue
                       else (1.0, "not rescaled: no host probe here"))
        out[name] = _q(q.value * factor, q.unit, f"{origin}, {how}: {q.source}")
    for name in SCALED_BY_CPU_RATE:
        q = getattr(ov, name)
        out[name] = _q(q.value * cpu_ratio, q.unit,
                       f"{origin}, x {cpu_ratio:.3g}, the reference's CPU optimizer rate over this host's at the default "
                       f"threads per rank ({ref_rate:.3g} / {here_rate:.3g} params/s): {q.source}")
    for name in AS_THEY_ARE:
        q = getattr(ov, name)
        out[name] = _q(q.value, q.unit, f"{origin}, a share, not rescaled: {q.source}")
    anchor = ov.issue_fitted_at_per_layer or ref.host.issue_per_layer
    if anchor is not None:
        out["issue_fitted_at_per_layer"] = _q(anchor.value, anchor.unit,
                                              f"{origin}: the host probe reading its issue constants were fitted at")
    return out


def carried_memory(ref: HardwareProfile) -> dict:
    """The pool's shares and the process's host memory, which only real runs measure: the reference's."""
    origin = f"carried from profile '{ref.name}' ({ref.provenance.kind}, {ref.provenance.date}), not rescaled"
    out = {}
    for name in MEMORY_SHARES:
        q = getattr(ref.memory, name)
        if q is not None:
            out[name] = _q(q.value, q.unit, f"{origin}: {q.source}")
    return out
