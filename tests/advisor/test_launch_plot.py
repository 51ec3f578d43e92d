from advisor.launch import default_program, launch
from advisor.plot import pareto_plot
from advisor.search import exhaustive_search
from models.strategy import Strategy


def test_one_node_launch_sets_the_threads():
    line = launch(Strategy(gpus=4, gpus_per_node=4, zero_stage=3), 18, default_program("cfg.json"))
    assert line.deepspeed == "OMP_NUM_THREADS=18 deepspeed --num_gpus 4 train.py --deepspeed --deepspeed_config cfg.json"
    assert line.torchrun.startswith("OMP_NUM_THREADS=18 torchrun --standalone --nproc_per_node 4 ")
    assert line.hostfile is None and line.notes == []


def test_multi_node_launch_and_notes():
    s = Strategy(gpus=16, gpus_per_node=4, zero_stage=3, offload_optimizer="cpu", super_offload=True, sp=4,
                 checkpoint_every=2)
    line = launch(s, 72, default_program("ds_config.json"))
    assert "--num_nodes 4 --num_gpus 4" in line.deepspeed and "--hostfile hostfile" in line.deepspeed
    assert "--nnodes 4 --nproc_per_node 4" in line.torchrun
    assert line.hostfile.splitlines() == ["node1 slots=4", "node2 slots=4", "node3 slots=4", "node4 slots=4"]
    text = " ".join(line.notes)
    assert "DistributedAttention" in text and "initialize_sequence_parallel(4)" in text
    assert "one layer in every 2" in text
    assert "__main__" in text
    assert "echo OMP_NUM_THREADS=72 >> .deepspeed_env" in text and line.torchrun.startswith("OMP_NUM_THREADS=72 ")


def test_pareto_plot_writes_a_png(tiny_problem, tmp_path):
    result = exhaustive_search(tiny_problem, "energy", 0.6)
    path = pareto_plot(result, tmp_path / "front.png", "tiny")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
