"""The prediction band as users see it: loaded beside the profile, put around each prediction."""
from __future__ import annotations

from models.band import Band, load_band
from models.profile import HardwareProfile, profile_path


def profile_band(name_or_path: str, profile: HardwareProfile) -> tuple[Band | None, str]:
    """The band `advisor fit` wrote beside this profile, and a note when there is none to use."""
    return load_band(profile_path(name_or_path), profile.to_json())


def band_fields(band: Band | None, step_time_s: float, energy_j: float, host_share: float | None) -> dict:
    """[low, high] at the band's level around a step time and an energy, from the band of steps with
    as much of their time on the host (the GPU energy's band is applied to the whole energy: the CPU's
    part is an estimate with no error measured); None without a band. `band_regime` names the band
    used: host_bound, gpu_bound, or None for the band of all runs."""
    if band is None:
        return {"step_time_s_band": None, "energy_j_band": None, "band_regime": None}
    bands, regime = band.for_share(host_share), band.regime_for(host_share)
    return {"step_time_s_band": [float(x) for x in bands.step_time_s.around(step_time_s)],
            "energy_j_band": [float(x) for x in bands.gpu_energy_j.around(energy_j)],
            "band_regime": regime}
