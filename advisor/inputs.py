"""Parsing what users type: token counts, GPU counts and ranges, percentages.

Every parser raises `InputError` (a ValueError) with a one-line message that names the
option and shows a valid example, so the CLI can print it without a traceback.
Importing this module is cheap (no numpy, no pydantic): the CLI calls it first.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass


class InputError(ValueError):
    """A command-line value that cannot be used; the message names the option."""


# --seq uses binary multiples, as context lengths are quoted: 32k = 32768, 1M = 1048576.
_SEQ_UNITS = {"": 1, "k": 1024, "m": 1024**2}
# --tokens and --global-batch counts use decimal multiples, as token budgets are quoted: 1B = 1e9.
_COUNT_UNITS = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12}
_NUMBER = re.compile(r"^\s*(\d+(?:\.\d+)?(?:e\d+)?)\s*([a-zA-Z]?)\s*$")


def _scaled(text: str, units: dict[str, int], option: str, example: str) -> int:
    match = _NUMBER.match(str(text))
    if not match or match.group(2).lower() not in units:
        raise InputError(f"bad {option} '{text}': use a count such as {example}")
    value = float(match.group(1)) * units[match.group(2).lower()]
    if value < 1 or value != math.floor(value):
        raise InputError(f"bad {option} '{text}': must be a positive whole number of tokens, such as {example}")
    return int(value)


def parse_seq(text: str) -> int:
    """`4096`, `4k` (4096), `32k` (32768), `1M` (1048576)."""
    return _scaled(text, _SEQ_UNITS, "--seq", "4096, 4k, 32k or 1M")


def parse_count(text: str, option: str = "--tokens") -> int:
    """Decimal counts: `1e9`, `500M`, `1B`, `2T`."""
    return _scaled(text, _COUNT_UNITS, option, "1e9, 500M, 10B or 2T")


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
    return GpuRange(low, high)


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
    if not raw.endswith("%") and value > 1:
        raise InputError(f"bad {option} '{text}': write {raw}% (or {value / 100:g})")
    if not 0 <= value or math.isnan(value) or math.isinf(value):
        raise InputError(f"bad {option} '{text}': must be zero or more, such as 10%")
    return value


def default_global_batch(seq_len: int) -> int:
    """About 2**20 tokens per optimizer step: max(1, 2**20 // seq) sequences."""
    return max(1, 2**20 // seq_len)


def step_global_batch(target: int, dp: int, micro_batch: int) -> tuple[int, int]:
    """The target global batch rounded up so dp * micro_batch divides it; returns (batch, grad_accum)."""
    per_pass = dp * micro_batch
    grad_accum = -(-target // per_pass)
    return grad_accum * per_pass, grad_accum
