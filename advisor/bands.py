"""The prediction band as users see it: loaded beside the profile, put around each prediction."""
from __future__ import annotations

import math

from models.band import Band, load_band
from models.profile import HardwareProfile, profile_path


def profile_band(name_or_path: str, profile: HardwareProfile) -> tuple[Band | None, str]:
    """The band `advisor fit` wrote beside this profile, and a note when there is none to use."""
    return load_band(profile_path(name_or_path), profile.to_json())


def band_fields(band: Band | None, step_time_s: float, energy_j: float, host_share: float | None,
                reserved_gpu_mem_gib: float | None = None, peak_gpu_mem_gib: float | None = None) -> dict:
    """[low, high] at the band's level around a step time and an energy, from the band of steps with
    as much of their time on the host (the GPU energy's band is applied to the whole energy: the CPU's
    part is an estimate with no error measured); None without a band. `band_regime` names the band
    used: host_bound, gpu_bound, or None for the band of all runs. Given the predicted pool and peak,
    the pool's band and the peak's: the pool's band with what lies outside the pool (CUDA's context,
    NCCL) as predicted; None where the band has no pool band."""
    if band is None:
        return {"step_time_s_band": None, "energy_j_band": None, "band_regime": None,
                "reserved_gpu_mem_gib_band": None, "peak_gpu_mem_gib_band": None}
    bands, regime = band.for_share(host_share), band.regime_for(host_share)
    pool = peak = None
    if (band.reserved_gpu_mem_gib is not None and reserved_gpu_mem_gib is not None and peak_gpu_mem_gib is not None
            and math.isfinite(reserved_gpu_mem_gib)):  # a search stored before it kept the pool: nan
        outside = peak_gpu_mem_gib - reserved_gpu_mem_gib
        pool = [float(x) for x in band.reserved_gpu_mem_gib.around(reserved_gpu_mem_gib)]
        peak = [x + outside for x in pool]
    return {"step_time_s_band": [float(x) for x in bands.step_time_s.around(step_time_s)],
            "energy_j_band": [float(x) for x in bands.gpu_energy_j.around(energy_j)],
            "band_regime": regime, "reserved_gpu_mem_gib_band": pool, "peak_gpu_mem_gib_band": peak}


def with_bands(band: Band | None, point: dict) -> dict:
    """A search point (`SearchResult.point`) with its bands (`band_fields`) beside its figures."""
    return {**point, **band_fields(band, point["step_time_s"], point["energy_j"], point["host_share"],
                                   point["reserved_gpu_mem_gib"], point["peak_gpu_mem_gib"])}


def pool_band_note(peak_gpu_mem_gib_band: list[float] | None, gpu_memory_gib: float, level: float | None) -> str | None:
    """A note where the peak fits as predicted but its band reaches past the GPU's memory; None otherwise."""
    if peak_gpu_mem_gib_band is None or level is None or peak_gpu_mem_gib_band[1] <= gpu_memory_gib:
        return None
    return (f"note: the peak fits as predicted, but torch's pool may take up to {peak_gpu_mem_gib_band[1]:.0f} GiB "
            f"with what lies outside it ({level:.0%} band of measured pools), over the GPU's {gpu_memory_gib:.0f}: "
            "torch then frees its cache and retries (slower), or runs out of memory")
