"""A profile's constants by dotted path ("overheads.step"): read one, or copy the profile with some
replaced. The fit, the pool's figures and the held-out checks all set constants this way."""
from __future__ import annotations

from models.profile import HardwareProfile


def getattr_path(profile: HardwareProfile, name: str):
    """The profile's node at a dotted path ("overheads.step" -> the Quantity)."""
    node = profile
    for key in name.split("."):
        node = getattr(node, key)
    return node


def get_value(profile: HardwareProfile, name: str) -> float:
    return float(getattr_path(profile, name).value)


def _set(node, path: tuple[str, ...], value: float, source: str | None):
    if not path:
        update = {"value": float(value)} if source is None else {"value": float(value), "source": source}
        return node.model_copy(update=update)
    return node.model_copy(update={path[0]: _set(getattr(node, path[0]), path[1:], value, source)})


def with_values(profile: HardwareProfile, values: dict[str, float], sources: dict[str, str] | None = None,
                validate: bool = False) -> HardwareProfile:
    """A copy of `profile` with the quantities named in `values` replaced (units kept).

    Without `validate` this is a cheap copy for the fit's inner loop; the profile written out is
    validated again."""
    for name, value in values.items():
        profile = _set(profile, tuple(name.split(".")), value, (sources or {}).get(name))
    return HardwareProfile.model_validate(profile.model_dump()) if validate else profile
