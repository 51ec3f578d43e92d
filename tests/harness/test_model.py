"""The validation model: shapes and parameter counts agree with what the cost model counts,
attention is causal GQA, checkpointing wraps the blocks it says, the vision path lands where
the data says, and a frozen encoder gets no gradients."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from harness_helpers import TINY, TINY_VL
from torch.utils.checkpoint import checkpoint as torch_checkpoint

from calibration.harness.data import make_batch, vision_group_starts
from calibration.harness.model import Checkpointing, CoreAttention, DecoderBlock, Transformer, rope_tables
from models.architecture import architecture_from_config, load_architecture
from models.memory import activation_bytes_per_token
from models.params import count_params
from models.workload import Workload

torch.manual_seed(0)


def tiny(vision: bool = False, **over):
    cfg = dict(TINY_VL if vision else TINY)
    cfg.update(over)
    return architecture_from_config(cfg, name="tiny")


def n_params(module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("head_dim", [None, 32])  # 32: heads twice as wide as hidden / heads (Qwen3, Gemma)
@pytest.mark.parametrize("model_type", [None, "qwen3", "gemma3_text"])  # q and k normalised per head; the sandwich
def test_text_parameters_equal_the_cost_models_count(tied, head_dim, model_type):
    arch = tiny(tie_word_embeddings=tied, **({} if head_dim is None else {"head_dim": head_dim}),
                **({} if model_type is None else {"model_type": model_type}))
    assert (arch.qk_norm, arch.sandwich_norms) == (model_type is not None, model_type == "gemma3_text")
    model = Transformer(arch)
    assert n_params(model) == arch.llm_params
    counts, layer = count_params(Workload(arch, 64)), model.layers[0]
    assert sorted(p.numel() for p in layer.parameters()) == sorted(arch.layer_tensors)  # in Hugging Face's order
    assert sum(1 for m in layer.modules() if any(True for _ in m.parameters(recurse=False))) == (
        counts.modules_per_llm_layer)


@pytest.mark.parametrize("model_type", [None, "qwen3", "gemma3_text"])
@pytest.mark.parametrize("head_dim", [None, 64, 16])
def test_a_decoder_block_saves_what_the_memory_model_counts(head_dim, model_type):
    """Autograd's saved tensors of one bf16 block, weights and the shared RoPE tables left out, are
    the memory model's per-token count to the byte, but for the norms' fp32 rsqrt over the hidden
    width (4 bytes a token each: two norms, four in Gemma 3's sandwich), which it leaves out; heads
    wider or narrower than hidden / heads, q and k normalised per head (Qwen3, Gemma 3) included."""
    cfg = {"hidden_size": 256, "num_hidden_layers": 1, "num_attention_heads": 8, "num_key_value_heads": 2,
           "intermediate_size": 512, "vocab_size": 64, **({} if head_dim is None else {"head_dim": head_dim}),
           **({} if model_type is None else {"model_type": model_type})}
    arch = architecture_from_config(cfg, name="block")
    block = DecoderBlock(arch, None).to(torch.bfloat16)
    seq = 128
    cos, sin = rope_tables(torch.arange(seq), arch.head_dim)
    shared = {p.untyped_storage().data_ptr() for p in [*block.parameters(), cos, sin]}
    saved: dict[int, int] = {}

    def keep(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in shared:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    x = torch.randn(1, seq, arch.hidden_size, dtype=torch.bfloat16, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        block(x, cos, sin)
    full, _ = activation_bytes_per_token(Workload(arch, seq))
    assert sum(saved.values()) / seq == float(full) + (4 if arch.sandwich_norms else 2) * 4


def test_real_preset_parameter_count_on_the_meta_device():
    arch = load_architecture("qwen2.5-1.5b")
    with torch.device("meta"):
        model = Transformer(arch)
    assert n_params(model) == arch.llm_params  # about 1.54e9, tied embeddings counted once


def test_vision_parameters_match_the_cost_model_up_to_biases():
    arch = load_architecture("qwen2.5-vl-7b")
    with torch.device("meta"):
        tower = Transformer(arch).vision
    counts = count_params(Workload(arch, 8192, frames=8))
    encoder = sum(p.numel() for p in tower.encoder_parameters())
    projector = n_params(tower.projector)
    # The cost model ignores biases and the position embedding: under 1% of the encoder.
    assert counts.vision_encoder <= encoder < 1.01 * counts.vision_encoder
    assert counts.projector <= projector < 1.001 * counts.projector


def test_loss_at_initialisation_is_that_of_a_uniform_guess():
    arch = tiny()
    model = Transformer(arch)
    tokens = torch.randint(0, arch.vocab_size, (2, 32))
    loss = model(tokens, torch.randint(0, arch.vocab_size, (2, 32)))
    assert abs(loss.item() - math.log(arch.vocab_size)) < 0.5


def test_core_attention_is_causal_gqa():
    q, k, v = torch.randn(1, 6, 4, 8), torch.randn(1, 6, 2, 8), torch.randn(1, 6, 2, 8)
    out = CoreAttention(causal=True)(q, k, v)
    # Reference: repeat each KV head for its two query heads, mask the future.
    kr, vr = k.repeat_interleave(2, dim=2), v.repeat_interleave(2, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, kr) / math.sqrt(8)
    scores = scores.masked_fill(torch.triu(torch.ones(6, 6, dtype=torch.bool), 1), float("-inf"))
    ref = torch.einsum("bhqk,bkhd->bqhd", F.softmax(scores, dim=-1), vr)
    assert torch.allclose(out, ref, atol=1e-5)
    # Changing a later position leaves earlier outputs alone.
    k2 = k.clone()
    k2[:, 5] += 1
    assert torch.allclose(CoreAttention(causal=True)(q, k2, v)[:, :5], out[:, :5], atol=1e-6)


@pytest.mark.parametrize("every, wrapped", [(0, []), (1, [0, 1, 2, 3]), (2, [0, 2]), (3, [0, 3])])
def test_checkpointing_wraps_every_kth_block_and_keeps_gradients(every, wrapped):
    arch = tiny(num_hidden_layers=4)
    calls = []

    def fn(block, *args):
        calls.append(block.func)  # the layer, its RoPE tables bound (see the test below)
        return torch_checkpoint(block, *args, use_reentrant=False)

    torch.manual_seed(1)
    plain = Transformer(arch)
    torch.manual_seed(1)
    ckpt = Transformer(arch, checkpointing=Checkpointing(every, fn))
    tokens, targets = torch.randint(0, 512, (1, 16)), torch.randint(0, 512, (1, 16))
    plain(tokens, targets).backward()
    ckpt(tokens, targets).backward()
    assert [list(ckpt.layers).index(b) for b in calls] == wrapped
    for a, b in zip(plain.parameters(), ckpt.parameters(), strict=True):
        assert torch.allclose(a.grad, b.grad, atol=1e-6)


@pytest.mark.parametrize("every", [1, 2])
def test_a_checkpoint_that_empties_its_tensor_arguments_leaves_the_shared_rope_tables_alone(every):
    """DeepSpeed's cpu_checkpointing keeps a CPU copy of each floating tensor handed to a checkpointed
    block and empties the tensor once the block's forward is done (deepspeed.checkpointing's
    get_cpu_activations_for_backward). The RoPE tables that every layer shares must not be handed over
    so, or the next layer meets a 0-dim table (one H200, 2026-12-02: 'IndexError: too many indices for
    tensor of dimension 0'). Its CPU path cannot run here (on the CPU its copy is the tensor itself)."""
    def emptying(block, *args):
        out = block(*args)
        for a in args:
            if torch.is_tensor(a) and a.is_floating_point():
                a.data = torch.empty([], dtype=a.dtype).data
        return out

    arch = tiny(num_hidden_layers=4)
    torch.manual_seed(1)
    plain = Transformer(arch)
    torch.manual_seed(1)
    ckpt = Transformer(arch, checkpointing=Checkpointing(every, emptying))
    tokens, targets = torch.randint(0, 512, (1, 16)), torch.randint(0, 512, (1, 16))
    with torch.no_grad():
        assert torch.allclose(ckpt(tokens, targets), plain(tokens, targets))


def test_vision_tokens_replace_the_embeddings_where_the_batch_says():
    arch = tiny(vision=True)
    workload = Workload(arch, 64, frames=4)  # 2 groups x 4 tokens
    batch = make_batch(workload, micro_batch=2, sp=1, sp_rank=0, dp_rank=0, device=torch.device("cpu"),
                       dtype=torch.float32)
    starts = vision_group_starts(workload)
    assert starts == [0, 32]
    expected = [b * 64 + s + t for b in range(2) for s in starts for t in range(4)]
    assert batch.vision_positions.tolist() == expected
    assert batch.pixels.shape == (4, 2, 3, 16, 16)

    model = Transformer(arch)
    seen = {}
    model.layers[0].register_forward_pre_hook(lambda m, args: seen.update(x=args[0].detach()))
    model(**batch.as_kwargs())
    with torch.no_grad():
        vision = model.vision(batch.pixels).reshape(-1, arch.hidden_size)
        text = model.embed_tokens(batch.tokens).reshape(-1, arch.hidden_size)
    x = seen["x"].reshape(-1, arch.hidden_size)
    assert torch.allclose(x[batch.vision_positions], vision[batch.vision_keep])
    others = [i for i in range(128) if i not in set(expected)]
    assert torch.allclose(x[others], text[others])


def test_sequence_shards_split_the_vision_groups_between_ranks():
    arch = tiny(vision=True)
    workload = Workload(arch, 64, frames=6)  # 3 groups at 0, 21, 42; shards [0, 32) and [32, 64)
    full = make_batch(workload, 1, 1, 0, 0, torch.device("cpu"), torch.float32)
    halves = [make_batch(workload, 1, 2, r, 0, torch.device("cpu"), torch.float32) for r in (0, 1)]
    assert [h.vision_groups for h in halves] == [2, 1]
    assert [h.position_offset for h in halves] == [0, 32]
    rebuilt = torch.cat([h.vision_positions + h.position_offset for h in halves])
    assert rebuilt.tolist() == full.vision_positions.tolist()
    assert torch.equal(torch.cat([h.tokens for h in halves], dim=1), full.tokens)
    # Ranks sharing a sample draw the same pixels for the groups they both touch.
    assert torch.equal(halves[1].pixels[0], full.pixels[2])


def test_frozen_encoder_gets_no_gradient_but_the_projector_does():
    arch = tiny(vision=True)
    model = Transformer(arch)
    model.freeze_vision_encoder()
    batch = make_batch(Workload(arch, 64, frames=4), 1, 1, 0, 0, torch.device("cpu"), torch.float32)
    model(**batch.as_kwargs()).backward()
    assert all(p.grad is None for p in model.vision.encoder_parameters())
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.vision.projector.parameters())


def test_the_loss_runs_on_fp32_logits_unless_asked_for_bf16():
    """Hugging Face casts the logits before the cross-entropy; the cost model's memory follows that dtype."""
    arch = architecture_from_config(TINY, "tiny")
    torch.manual_seed(0)
    fp32 = Transformer(arch, loss_dtype="fp32").to(torch.bfloat16)
    bf16 = Transformer(arch, loss_dtype="bf16").to(torch.bfloat16)
    bf16.load_state_dict(fp32.state_dict())
    tokens = torch.randint(0, arch.vocab_size, (1, 32))
    loss32, loss16 = fp32(tokens, tokens), bf16(tokens, tokens)
    assert loss32.dtype == torch.float32 and loss16.dtype == torch.bfloat16
    assert loss32.item() == pytest.approx(loss16.item(), rel=0.02)
