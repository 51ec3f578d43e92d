"""Parsing what users type: token counts, GPU counts and ranges, percentages.

Every parser raises `InputError` (a ValueError) with a one-line message that names the
option and shows a valid example, so the CLI can print it without a traceback.
Importing this module is cheap (no numpy, no pydantic): the CLI calls it first.
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass

import click

from models.limits import MAX_GPUS, MAX_SEQ, MAX_SEQUENCES, MAX_TOKENS


class InputError(ValueError):
    """A command-line value that cannot be used; the message names the option."""


# --seq uses binary multiples, as context lengths are quoted: 32k = 32768, 1M = 1048576.
_SEQ_UNITS = {"": 1, "k": 1024, "m": 1024**2}
# --tokens and --global-batch counts use decimal multiples, as token budgets are quoted: 1B = 1e9.
_COUNT_UNITS = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12}
_NUMBER = re.compile(r"^\s*(\d+(?:\.\d+)?(?:e\d+)?)\s*([a-zA-Z]?)\s*$")


def _scaled(text: str, units: dict[str, int], option: str, example: str, noun: str, limit: int) -> int:
    match = _NUMBER.match(str(text))
    if not match or match.group(2).lower() not in units:
        raise InputError(f"bad {option} '{text}': use a count such as {example}")
    value = float(match.group(1)) * units[match.group(2).lower()]
    if not math.isfinite(value) or value > limit:
        raise InputError(f"bad {option} '{text}': at most {limit:,} {noun}")
    if value < 1 or value != math.floor(value):
        raise InputError(f"bad {option} '{text}': must be a positive whole number of {noun}, such as {example}")
    return int(value)


def parse_seq(text: str) -> int:
    """`4096`, `4k` (4096), `32k` (32768), `1M` (1048576)."""
    return _scaled(text, _SEQ_UNITS, "--seq", "4096, 4k, 32k or 1M", "tokens", MAX_SEQ)


def parse_count(text: str, option: str = "--tokens") -> int:
    """Decimal counts of tokens: `1e9`, `500M`, `1B`, `2T`."""
    return _scaled(text, _COUNT_UNITS, option, "1e9, 500M, 10B or 2T", "tokens", MAX_TOKENS)


def parse_sequences(text: str, option: str = "--global-batch") -> int:
    """Decimal counts of sequences: `512`, `2k`."""
    return _scaled(text, _COUNT_UNITS, option, "512 or 2k", "sequences", MAX_SEQUENCES)


@dataclass(frozen=True)
class GpuRange:
    """`--gpus 8` (fixed) or `--gpus 4-64` (the count is searched too)."""

    low: int
    high: int

    @property
    def fixed(self) -> bool:
        return self.low == self.high

    def counts(self, gpus_per_node: int) -> list[int]:
        """Counts worth searching: powers of two within one node, whole nodes beyond
        (doubling), and the range's own ends where they form whole nodes."""
        candidates = {self.low, self.high}
        c = 1
        while c <= self.high:
            candidates.add(c)
            c *= 2
        c = gpus_per_node
        while c <= self.high:
            candidates.add(c)
            c *= 2
        counts = sorted(
            n for n in candidates if self.low <= n <= self.high and (n <= gpus_per_node or n % gpus_per_node == 0)
        )
        if not counts:
            raise InputError(
                f"--gpus {self.low}-{self.high}: no count in that range fills whole nodes of {gpus_per_node} GPUs"
            )
        return counts


def parse_gpus(text: str | int) -> GpuRange:
    match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", str(text))
    if not match:
        raise InputError(f"bad --gpus '{text}': use a count (8) or a range (4-64)")
    low = int(match.group(1))
    high = int(match.group(2) or low)
    if low < 1 or high < low:
        raise InputError(f"bad --gpus '{text}': counts must be positive and the range must rise (4-64)")
    if high > MAX_GPUS:
        raise InputError(f"bad --gpus '{text}': at most {MAX_GPUS:,} GPUs")
    return GpuRange(low, high)


def counts_within_run(counts: list[int], widest_sp, seq_len: int, tokens: int) -> tuple[list[int], list[str]]:
    """GPU counts whose smallest step fits in the run: at least one sequence per data-parallel
    rank, at the widest Ulysses degree `widest_sp(count)` allows. Returns (kept, why each other was dropped)."""
    kept, dropped = [], []
    for gpus in counts:
        smallest = gpus // widest_sp(gpus) * seq_len
        if smallest > tokens:
            dropped.append(f"{gpus} GPUs: one step is at least {gpus // widest_sp(gpus):,} sequences "
                           f"({smallest:.3g} tokens), more than the run's {tokens:.3g} tokens")
        else:
            kept.append(gpus)
    if not kept:
        raise InputError(f"--gpus: {dropped[0]}; use fewer GPUs or raise --tokens")
    return kept, dropped


def check_whole_nodes(gpus: int, gpus_per_node: int) -> None:
    """A job is launched with the same number of ranks on every node."""
    if gpus > gpus_per_node and gpus % gpus_per_node:
        raise InputError(f"--gpus {gpus} does not fill whole nodes of {gpus_per_node} GPUs; use a multiple of {gpus_per_node}")


def parse_fraction(text: str, option: str = "--max-slowdown") -> float:
    """`10%` or `0.1`; a bare number above 1 is refused as ambiguous."""
    raw = str(text).strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise InputError(f"bad {option} '{text}': use a percentage such as 10% (or 0.1)") from None
    if not math.isfinite(value):
        raise InputError(f"bad {option} '{text}': use a finite percentage such as 10% (or 0.1)")
    if not raw.endswith("%") and value > 1:
        raise InputError(f"bad {option} '{text}': write {raw}% (or {value / 100:g})")
    if value < 0:
        raise InputError(f"bad {option} '{text}': must be zero or more, such as 10%")
    return value


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, as a scheduler's allocation sets it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def check_jobs(jobs: int, option: str = "--jobs") -> int:
    """A count of worker processes, refused beyond the cores: more only queue for the same cores, each
    holding a copy of the runs (--jobs 100000 ran for minutes and left 522 processes holding 20 GB)."""
    cores = usable_cores()
    if jobs > cores:
        raise InputError(f"bad {option} {jobs}: this machine gives {cores} cores to this command; give at most {cores}")
    return jobs


def default_global_batch(seq_len: int) -> int:
    """About 2**20 tokens per optimizer step: max(1, 2**20 // seq) sequences."""
    return max(1, 2**20 // seq_len)


def step_global_batch(target: int, dp: int, micro_batch: int) -> tuple[int, int]:
    """The target global batch rounded up so dp * micro_batch divides it; returns (batch, grad_accum)."""
    per_pass = dp * micro_batch
    grad_accum = -(-target // per_pass)
    return grad_accum * per_pass, grad_accum


class FiniteFloatRange(click.FloatRange):
    """click's FloatRange without NaN (which passes its bounds, every comparison being false) or
    infinity: a window, timeout or budget of inf runs until the machine is taken away."""

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number
