"""The raw JSONL file: appended as results come, resumed after an interruption, never mixed across machines."""
import json

import pytest
from cal_helpers import rr

from calibration.rawlog import RawLog, RawLogMismatch, raw_path_for, read_raw

HEADER = {"kind": "measured", "device": "NVIDIA H200", "gpus_per_node": 2, "nodes": 1, "quick": True,
          "machine": "n1"}


def test_raw_path_sits_beside_the_profile(tmp_path):
    assert raw_path_for(tmp_path / "h200.json") == tmp_path / "h200.raw.jsonl"
    assert raw_path_for(tmp_path / "h200") == tmp_path / "h200.raw.jsonl"


def test_results_are_on_disk_at_once_and_reused(tmp_path):
    path = tmp_path / "p.raw.jsonl"
    log = RawLog(path, HEADER)
    log.append(rr("gemm/a", "gemm", {"flop_per_s": 1.0}))
    log.append(rr("gemm/b", "gemm", {}, status="failed", reason="OOM"))
    log.append(rr("overlap/x", "overlap", {}, status="skipped", reason="one GPU"))
    lines = path.read_text().splitlines()
    assert json.loads(lines[0])["type"] == "header" and len(lines) == 4
    again = RawLog(path, HEADER)
    assert again.done_keys() == {"gemm/a", "overlap/x"}  # failed ones are retried
    assert again.results()["gemm/a"].data == {"flop_per_s": 1.0}


def test_latest_result_of_a_key_wins(tmp_path):
    path = tmp_path / "p.raw.jsonl"
    log = RawLog(path, HEADER)
    log.append(rr("gemm/a", "gemm", {}, status="failed", reason="OOM"))
    log.append(rr("gemm/a", "gemm", {"flop_per_s": 2.0}))
    header, results = read_raw(path)
    assert results["gemm/a"].status == "ok" and header["device"] == "NVIDIA H200"


def test_a_line_cut_short_by_the_interruption_is_dropped_and_remeasured(tmp_path):
    path = tmp_path / "p.raw.jsonl"
    log = RawLog(path, HEADER)
    log.append(rr("gemm/a", "gemm", {"x": 1}))
    with open(path, "a") as f:
        f.write('{"type": "result", "key": "gemm/b", "fam')  # killed mid-write
    again = RawLog(path, HEADER)
    assert again.done_keys() == {"gemm/a"}
    again.append(rr("gemm/b", "gemm", {"x": 2}))
    assert RawLog(path, HEADER).done_keys() == {"gemm/a", "gemm/b"}


def test_a_raw_file_from_another_machine_is_refused(tmp_path):
    path = tmp_path / "p.raw.jsonl"
    RawLog(path, HEADER).append(rr("gemm/a", "gemm", {}))
    with pytest.raises(RawLogMismatch, match="device"):
        RawLog(path, dict(HEADER, device="NVIDIA H100"))
    with pytest.raises(RawLogMismatch, match="quick"):
        RawLog(path, dict(HEADER, quick=False))


def test_fresh_starts_over_and_keeps_the_old_file(tmp_path):
    path = tmp_path / "p.raw.jsonl"
    RawLog(path, HEADER).append(rr("gemm/a", "gemm", {}))
    log = RawLog(path, dict(HEADER, device="other"), fresh=True)
    assert log.done_keys() == set()
    assert (tmp_path / "p.raw.jsonl.old").exists()


def test_garbage_in_the_middle_is_an_error(tmp_path):
    path = tmp_path / "p.raw.jsonl"
    RawLog(path, HEADER).append(rr("gemm/a", "gemm", {}))
    text = path.read_text().splitlines()
    path.write_text("\n".join([text[0], "not json", text[1]]) + "\n")
    with pytest.raises(RawLogMismatch, match=":2"):
        RawLog(path, HEADER)
