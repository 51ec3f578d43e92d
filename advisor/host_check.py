"""Is the host a run landed on as fast as its profile says? And how to measure it when it is not.

CPU offload's step time follows the host's CPU optimizer, and a host-bound step its single-thread
issue speed. Lent 2x H200 hosts of one kind ran the same offload step up to 1.8x apart, and one
ZeRO-3 step 1.5x apart (2026-12-01, data/runs/README.md), so a profile calibrated on one host
mispredicts another. The harness probes both on every rank before each run, and the issue time again after its
measured window (`calibration.harness.host_probe`); this compares them with the profile's for the same threads
and ranks, and says how to calibrate the host when they differ.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from models.band import regime_of
from runs.record import probed_issue_us

# The probe repeats within 4-7% on one host (benchmarks/host_probe.py), and one host's rate drifted
# 15% in minutes; hosts of one kind differed up to 1.8x. Beyond 20% the host, not the noise, speaks.
HOST_TOLERANCE = 0.20


def calibrate_host_commands(profile_name: str) -> str:
    """The two commands that measure a node's CPU optimizer and issue time into a copy of `profile_name`."""
    return (f"advisor calibrate --gpus 1 --only cpu_adam --only cpu_adam_threads --only host_issue "
            f"--fill-from {profile_name} --out host.json; python -m calibration.merge host.raw.jsonl --into "
            f"{profile_name} --out mine.json; then --profile mine.json")


@dataclass(frozen=True)
class HostCheck:
    """One host rate the run probed against the profile's, as speeds (more is faster)."""

    profile_name: str
    what: str  # "CPU optimizer" | "issue time"
    measured_speed: float  # the run's probe, its slowest rank: params/s, or layers issued per second
    profile_speed: float  # the profile's, for this run's threads and ranks
    conditions: str  # what the two were taken at, for the note

    @property
    def ratio(self) -> float:
        return self.measured_speed / self.profile_speed

    @property
    def distance(self) -> float:
        """How far off, faster or slower alike: |log ratio|."""
        return abs(math.log(self.ratio))

    @property
    def differs(self) -> bool:
        return abs(self.ratio - 1.0) > HOST_TOLERANCE

    def to_dict(self) -> dict:
        return {**asdict(self), "ratio": self.ratio, "differs": self.differs,
                "note": self.note if self.differs else None}

    @property
    def note(self) -> str:
        speed = "faster" if self.ratio > 1 else "slower"
        return (f"this host's {self.what} ran at {self.ratio:.2f}x the speed of profile {self.profile_name}'s "
                f"({self.conditions}): where this run's step is {speed} than predicted, the host is a likely cause. "
                "Measure it: " + calibrate_host_commands(self.profile_name))


def _cpu_optimizer_check(host_probe: dict, strategy, profile) -> HostCheck | None:
    """Only where the run offloads the optimizer: no other step depends on CPUAdam."""
    measured = host_probe.get("cpu_adam_params_per_s")
    if strategy.offload_optimizer != "cpu" or not measured:
        return None
    threads, ranks = int(host_probe["threads"]), strategy.ranks_per_node
    expected = float(profile.host.cpu_adam_per_rank(threads, ranks, profile.gpus_per_node.value))
    return HostCheck(profile.name, "CPU optimizer", float(measured), expected,
                     f"{measured / 1e9:.2f} against {expected / 1e9:.2f} G params/s at {threads} thread"
                     f"{'s' * (threads > 1)} a rank, {ranks} rank{'s' * (ranks > 1)}")


def _issue_check(host_probe: dict, strategy, profile) -> HostCheck | None:
    """Every probed run: host-bound steps (small models, short contexts, ZeRO-3 hooks) follow it."""
    measured_us, expected = probed_issue_us(host_probe, strategy.zero_stage), profile.host.issue_per_layer
    if not measured_us or expected is None:
        return None
    return HostCheck(profile.name, "issue time", 1e6 / measured_us, 1.0 / expected.value,
                     f"{measured_us:.0f} against {expected.value * 1e6:.0f} us a layer")


def check_host(host_probe: dict | None, strategy, profile) -> HostCheck | None:
    """The run's probed host against the profile's: the check furthest off of those that apply (the
    CPU optimizer for offload runs, the issue time for all); None where the run probed nothing."""
    if not host_probe:
        return None
    checks = [c for c in (_cpu_optimizer_check(host_probe, strategy, profile),
                          _issue_check(host_probe, strategy, profile))
              if c is not None]
    return max(checks, key=lambda c: c.distance, default=None)


def worst_host_note(records, profile) -> str:
    """The note of the run whose host strayed furthest from the profile (a loop's runs share a host);
    empty when every probed run is within the tolerance or none probed."""
    from models.strategy import Strategy

    checks = [check_host(r.result.host_probe, Strategy(**r.candidate.strategy), profile)
              for r in records if r is not None and r.candidate.strategy is not None]
    off = [c for c in checks if c is not None and c.differs]
    return max(off, key=lambda c: c.distance).note if off else ""


def host_bound_notes(prediction) -> list[str]:
    """A note for a step that the host's issue speed sets (models.predict.Prediction); none otherwise.
    The same 512-token ZeRO-3 step took 0.46 s on a 2x H200 host and 0.71 s on a one-H200 slice
    (2026-12-01, data/runs/README.md): the profile's host is not every host."""
    share = prediction.host_share
    if regime_of(share) != "host_bound":
        return []
    return [f"note: {share:.0%} of this step is the host's (kernel launches, autograd, ZeRO hooks, DeepSpeed's host "
            "work, the CPU optimizer), which follows the host's speed: lent H200 hosts ran such steps up to 1.75x "
            "apart, and the band around this prediction is the wider one of host-bound steps. More work per launch "
            "(a longer context, a larger micro-batch) hides the issue time behind the GPU. On the machine you will "
            "train on, `advisor recommend --validate K` measures the closest candidates in interleaved rounds and "
            "picks by measurement."]
