"""What `recommend` and `predict` say about a pick whose CPU offload may run slower than predicted."""
from advisor.recommend import thread_warnings
from models.profile import load_profile
from models.strategy import Strategy

H200 = load_profile("h200")


def test_one_thread_offload_is_warned():
    said = thread_warnings(Strategy(gpus=2, zero_stage=2, offload_optimizer="cpu", cpu_threads_per_rank=1), H200)
    assert any(line.startswith("warning:") and "one thread per rank" in line for line in said)


def test_more_threads_than_cores_is_warned():
    cores = int(H200.host.cores.value)
    said = thread_warnings(Strategy(gpus=2, gpus_per_node=2, zero_stage=2, cpu_threads_per_rank=cores), H200)
    assert any("exceed the" in line for line in said)


def test_offload_names_the_host_it_was_measured_on_and_how_to_measure_yours():
    said = thread_warnings(Strategy(gpus=2, zero_stage=2, offload_optimizer="cpu"), H200)
    note = [line for line in said if line.startswith("note:")]
    assert len(note) == 1 and H200.host.cpu in note[0]
    assert "advisor calibrate --gpus 1 --only cpu_adam --only cpu_adam_threads --only host_issue --fill-from h200" in note[0]
    # merged into the whole profile: a one-GPU calibration's own profile says one GPU per node
    assert "python -m calibration.merge host.raw.jsonl --into h200 --out mine.json" in note[0]
    assert not any(line.startswith("warning:") for line in said)  # the default threads are the node's cores shared


def test_nothing_to_say_without_offload():
    assert thread_warnings(Strategy(gpus=2, zero_stage=3), H200) == []
