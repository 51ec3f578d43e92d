"""The memory cap's reading of its environment variable, and its share of the device."""
import pytest

from calibration.harness import memory_cap


@pytest.mark.parametrize("text, cap", [("12.5", 12.5), ("", None), ("0", None), ("-3", None), ("lots", None)])
def test_the_cap_is_a_positive_number_of_gib_or_none(monkeypatch, text, cap):
    monkeypatch.setenv(memory_cap.ENV, text)
    assert memory_cap.cap_gib() == cap


def test_the_share_of_the_device_never_exceeds_all_of_it():
    total = 140 * memory_cap.GIB
    assert memory_cap.fraction_of(35.0, total) == pytest.approx(0.25)
    assert memory_cap.fraction_of(500.0, total) == 1.0
