"""Model architectures: LLaMA-style decoders, optionally fed by a ViT vision encoder.

A decoder's heads may be wider or narrower than hidden / heads: Qwen3, Gemma and Mistral-Nemo
configs say so with `head_dim`, and then q, o, k and v are sized by it, not by the hidden width.
Mixture-of-experts configs and decoders of another block (a plain GELU MLP, LayerNorm, parallel
attention: GPT-NeoX, Phi-2, StarCoder2, ...) are refused: they would be counted as dense SwiGLU
decoders, and a prediction that looks right but is not is worse than none.

Presets ship as JSON files in models/presets/ (one per model, Hugging Face field names), package
data read through importlib.resources, so an installed wheel has them.
A user's own `config.json` in the Hugging Face format is read the same way; LLaVA's
layout (`text_config` + `vision_config`) and Qwen2-VL's (top-level text fields +
`vision_config`) both work.
"""
from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from models.input_file import read_json, shown
from models.limits import MAX_HEADS, MAX_LAYERS, MAX_PARAMS, MAX_PER_SAMPLE, MAX_VOCAB, MAX_WIDTH

REPO_ROOT = Path(__file__).resolve().parent.parent
PRESETS = resources.files(__package__) / "presets"

# Short names users type; the README says which model each one means.
ALIASES = {"7B": "llama-2-7b", "13B": "llama-2-13b", "70B": "llama-2-70b"}


# Hugging Face's names for the expert count (Mixtral, Qwen2/3-MoE, DeepSeek, OLMoE, GPT-OSS).
MOE_EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")


# Hugging Face model types whose decoder block is not LLaMA's: no gated MLP, or (mllama) image
# features entering through cross-attention layers rather than as tokens. Their configs carry the
# same width keys, so only the type tells them apart.
OTHER_BLOCK_MODEL_TYPES = frozenset({
    "gpt2", "gpt_neo", "gpt_neox", "gpt_neox_japanese", "gptj", "gpt_bigcode", "codegen", "phi",
    "starcoder2", "falcon", "opt", "bloom", "mpt", "persimmon", "biogpt", "xglm",
    "mllama", "mllama_text_model",
    "gemma2",  # soft-capped attention scores: Hugging Face runs it eagerly, the scores held whole
})


# Vision towers whose MLP is gated (SwiGLU), by the config's model type: Qwen2.5-VL's. CLIP's,
# SigLIP's, Qwen2-VL's and Qwen3-VL's are plain; a config may say so itself with `gated_mlp`.
GATED_VISION_MODEL_TYPES = frozenset({"qwen2_5_vl"})

# Model types whose attention normalises q and k (per head, before RoPE); a config may also say so
# with `use_qk_norm` or `qk_norm`.
QK_NORM_MODEL_TYPES = frozenset({"qwen3", "qwen3_vl", "qwen3_vl_text", "gemma3", "gemma3_text", "olmo2"})
# Model types with four norms a layer: the attention's and the MLP's outputs normalised again.
SANDWICH_NORM_MODEL_TYPES = frozenset({"gemma3", "gemma3_text"})

# `layer_types` the model counts as causal softmax attention; a sliding window is counted in full.
# Others (Qwen3.5's linear_attention, a gated delta rule) have another cost and are refused.
ATTENTION_LAYER_TYPES = frozenset({"full_attention", "sliding_attention"})


class ModelConfigError(ValueError):
    """A model name or config.json that cannot be used; the message says why."""


@dataclass(frozen=True)
class VisionEncoder:
    """A ViT encoder plus the projector into the LLM. Patch tokens come from image and patch size."""

    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    patch_size: int
    image_size: int
    projector_hidden_size: int  # width of the MLP projector's hidden layer
    spatial_merge: int = 1  # tokens merged per side before the LLM (Qwen2-VL merges 2x2)
    temporal_patch: int = 1  # frames folded into one patch along time (Qwen2-VL uses 2)
    gated_mlp: bool = False

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def patches_per_image(self, image_size: int | None = None) -> int:
        side = (image_size or self.image_size) // self.patch_size
        return side * side

    def llm_tokens_per_image(self, image_size: int | None = None) -> int:
        return self.patches_per_image(image_size) // (self.spatial_merge**2)


@dataclass(frozen=True)
class Architecture:
    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    tie_embeddings: bool = False
    vision: VisionEncoder | None = None
    # A config's head_dim where it is not hidden_size / num_heads (None: it is, as LLaMA and Qwen2 have
    # it); kept apart from `head_dim` so that a copy with other widths derives its heads again.
    config_head_dim: int | None = None
    qk_norm: bool = False  # an RMSNorm over each head of q and of k before RoPE (Qwen3, Gemma 3, OLMo 2)
    sandwich_norms: bool = False  # the attention's and the MLP's outputs normalised before each add (Gemma 3)

    @property
    def head_dim(self) -> int:
        return self.config_head_dim or self.hidden_size // self.num_heads

    @property
    def attention_dim(self) -> int:
        """Width of the queries and of the attention output (o_proj's input): heads x head_dim."""
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def qk_norm_dim(self) -> int:
        """The width the q/k norms normalise (every head of q and of k); 0 without them."""
        return self.attention_dim + self.kv_dim if self.qk_norm else 0

    @property
    def sandwich_norm_dim(self) -> int:
        """The width Gemma 3's two sandwich norms normalise (the attention's and the MLP's outputs); 0 without."""
        return 2 * self.hidden_size if self.sandwich_norms else 0

    @property
    def layer_tensors(self) -> tuple[int, ...]:
        """Elements of each parameter tensor of one decoder block, in Hugging Face's order, one module
        each: q, k, v, o (GQA), the q and k norms (Qwen3, Gemma 3), gate, up, down (SwiGLU), two
        RMSNorms and Gemma 3's two sandwich norms."""
        h, q, kv, f = self.hidden_size, self.attention_dim, self.kv_dim, self.intermediate_size
        qk_norms = (self.head_dim, self.head_dim) if self.qk_norm else ()
        norms = (h, h, h, h) if self.sandwich_norms else (h, h)
        return (h * q, h * kv, h * kv, q * h, *qk_norms, h * f, h * f, f * h, *norms)

    @property
    def layer_params(self) -> int:
        """Parameters of one decoder block."""
        return sum(self.layer_tensors)

    @property
    def embedding_params(self) -> int:
        copies = 1 if self.tie_embeddings else 2
        return copies * self.vocab_size * self.hidden_size

    @property
    def llm_params(self) -> int:
        return self.num_layers * self.layer_params + self.embedding_params + self.hidden_size


# The largest value of each key (models.limits): beyond them no model exists, and the counts overflow.
_MOST = {"num_hidden_layers": MAX_LAYERS, "depth": MAX_LAYERS, "num_attention_heads": MAX_HEADS,
         "num_key_value_heads": MAX_HEADS, "num_heads": MAX_HEADS, "vocab_size": MAX_VOCAB,
         "patch_size": MAX_PER_SAMPLE, "image_size": MAX_PER_SAMPLE, "spatial_merge_size": 64,
         "temporal_patch_size": 64}


def _positive_int(value, key: str, origin: str) -> int:
    most = _MOST.get(key, MAX_WIDTH)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= most:
        raise ModelConfigError(f"{origin}: key '{key}' must be a positive integer of at most {most:,}, "
                               f"got {shown(value)}")
    return value


def _require(cfg: dict, key: str, origin: str):
    if key not in cfg:
        raise ModelConfigError(f"{origin}: missing key '{key}'")
    return _positive_int(cfg[key], key, origin)


def _first(cfg: dict, keys: tuple[str, ...], origin: str, default: int | None = None) -> int:
    """The first of `keys` the config gives (Hugging Face's names differ by model), a positive
    integer; `default` where none is given, else an error naming the first."""
    for key in keys:
        if key in cfg:
            return _positive_int(cfg[key], key, origin)
    if default is None:
        raise ModelConfigError(f"{origin}: missing key '{keys[0]}'")
    return default


def _flag(value, key: str, origin: str) -> bool:
    if not isinstance(value, bool):
        raise ModelConfigError(f"{origin}: key '{key}' must be true or false, got {shown(value)}")
    return value


def _model_type(cfg: dict) -> str | None:
    """A config's `model_type`; None where it gives none, or something that is not a name."""
    value = cfg.get("model_type")
    return value if isinstance(value, str) else None


def _mlp_width(cfg: dict, hidden: int, where: str) -> int:
    """The tower's MLP width: `intermediate_size`, else `mlp_ratio` x width (Qwen2-VL), else 4 x width."""
    if "intermediate_size" in cfg or "mlp_ratio" not in cfg:
        return _first(cfg, ("intermediate_size",), where, 4 * hidden)
    ratio = cfg["mlp_ratio"]
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= MAX_WIDTH / hidden:
        raise ModelConfigError(f"{where}: key 'mlp_ratio' must be a positive number of at most "
                               f"{MAX_WIDTH / hidden:g} (an MLP {MAX_WIDTH:,} wide), got {shown(ratio)}")
    return max(1, round(ratio * hidden))


def _vision_from_config(cfg, text_hidden: int, origin: str, model_type) -> VisionEncoder:
    """Hugging Face's vision_config layouts: CLIP and SigLIP (LLaVA), Qwen2-VL (`embed_dim` is the
    tower's width, its `hidden_size` the merger's output), Qwen2.5-VL (a gated MLP). The projector's
    hidden width is the merged patch width where patches merge (Qwen's mergers), else the LLM's."""
    where = f"{origin} vision_config"
    if not isinstance(cfg, dict):
        raise ModelConfigError(f"{where}: expected a JSON object, got {shown(cfg)}")
    hidden = _first(cfg, ("embed_dim", "hidden_size"), where)
    merge = _first(cfg, ("spatial_merge_size",), where, 1)
    own_type = _model_type(cfg)
    return VisionEncoder(
        hidden_size=hidden,
        # Qwen's `depth` and `num_heads` first: newer Qwen2.5-VL configs also write a stray
        # `num_hidden_layers` of 1 beside `depth` 32
        num_layers=_first(cfg, ("depth", "num_hidden_layers"), where),
        num_heads=_first(cfg, ("num_heads", "num_attention_heads"), where),
        intermediate_size=_mlp_width(cfg, hidden, where),
        patch_size=_require(cfg, "patch_size", where),
        image_size=_first(cfg, ("image_size",), where, 336),
        projector_hidden_size=_first(cfg, ("projector_hidden_size",), where,
                                     hidden * merge**2 if merge > 1 else text_hidden),
        spatial_merge=merge,
        temporal_patch=_first(cfg, ("temporal_patch_size",), where, 1),
        gated_mlp=_flag(cfg.get("gated_mlp", bool({model_type, own_type} & GATED_VISION_MODEL_TYPES)), "gated_mlp",
                        where),
    )


def _refuse_what_is_not_modelled(text: dict, model_types: set[str], where: str) -> None:
    """One line for a decoder the cost model would count as something it is not: another block, a
    mixture of experts, layers other than softmax attention."""
    other = sorted(model_types & OTHER_BLOCK_MODEL_TYPES)
    if other:
        raise ModelConfigError(f"{where}: model_type '{other[0]}' has a decoder block other than LLaMA's; "
                               "only LLaMA-style decoders are modelled")
    experts = next((text[k] for k in MOE_EXPERT_KEYS if isinstance(text.get(k), int) and text[k] > 1), None)
    if experts is not None:
        raise ModelConfigError(f"{where}: a mixture-of-experts model ({shown(experts)} experts) is not modelled; "
                               "only dense decoders are")
    layer_types = text.get("layer_types")
    if layer_types is not None:
        if not isinstance(layer_types, list):
            raise ModelConfigError(f"{where}: key 'layer_types' must be a list, got {shown(layer_types)}")
        other_layers = [t for t in layer_types if not (isinstance(t, str) and t in ATTENTION_LAYER_TYPES)]
        if other_layers:
            raise ModelConfigError(f"{where}: layers of type {shown(other_layers[0])} are not modelled; "
                                   "only softmax attention layers are")


def architecture_from_config(cfg: dict, name: str, origin: str = "<config>") -> Architecture:
    """Build an Architecture from a Hugging Face-style config dict."""
    if not isinstance(cfg, dict):
        raise ModelConfigError(f"{origin}: expected a JSON object")
    text = cfg.get("text_config", cfg)
    where = f"{origin} text_config" if "text_config" in cfg else origin
    if not isinstance(text, dict):
        raise ModelConfigError(f"{where}: expected a JSON object, got {shown(text)}")
    outer_type = _model_type(cfg)
    types = {t for t in (_model_type(text), outer_type) if t is not None}
    _refuse_what_is_not_modelled(text, types, where)
    hidden = _require(text, "hidden_size", where)
    heads = _require(text, "num_attention_heads", where)
    kv_heads = text.get("num_key_value_heads")
    if kv_heads is None:  # absent or null (Phi-3 and others write null): one KV head per head
        kv_heads = heads
    if not isinstance(kv_heads, int) or isinstance(kv_heads, bool) or kv_heads <= 0 or heads % kv_heads:
        raise ModelConfigError(f"{where}: key 'num_key_value_heads' must divide num_attention_heads ({heads}), "
                               f"got {shown(kv_heads)}")
    qk_key = "use_qk_norm" if "use_qk_norm" in text else "qk_norm"
    head_dim = text.get("head_dim")
    if head_dim is None:
        if hidden % heads:
            raise ModelConfigError(f"{where}: hidden_size {hidden} is not divisible by num_attention_heads {heads}"
                                   " and no head_dim is given")
    else:
        _positive_int(head_dim, "head_dim", where)
    vision = None
    if cfg.get("vision_config") is not None:  # null: a text model (some configs write it so)
        vision = _vision_from_config(cfg["vision_config"], hidden, origin, outer_type)
        stated = cfg.get("mm_tokens_per_image")  # Gemma 3 pools its patches to this many
        if stated is not None and stated != vision.llm_tokens_per_image():
            raise ModelConfigError(f"{origin}: mm_tokens_per_image is {shown(stated)}, where patches merged as this model "
                                   f"merges them give {vision.llm_tokens_per_image()}: a pooling tower is not modelled")
    arch = Architecture(
        name=name,
        hidden_size=hidden,
        num_layers=_require(text, "num_hidden_layers", where),
        num_heads=heads,
        num_kv_heads=kv_heads,
        intermediate_size=_require(text, "intermediate_size", where),
        vocab_size=_require(text, "vocab_size", where),
        tie_embeddings=_flag(text.get("tie_word_embeddings", cfg.get("tie_word_embeddings", False)),
                             "tie_word_embeddings", where),
        vision=vision,
        config_head_dim=None if head_dim is None or head_dim * heads == hidden else head_dim,
        qk_norm=_flag(text.get(qk_key, bool(types & QK_NORM_MODEL_TYPES)), qk_key, where),
        sandwich_norms=bool(types & SANDWICH_NORM_MODEL_TYPES),
    )
    v = vision
    tower = v.num_layers * v.hidden_size * (4 * v.hidden_size + 3 * v.intermediate_size) if v else 0  # about
    if arch.llm_params + tower > MAX_PARAMS:
        raise ModelConfigError(f"{origin}: {arch.llm_params + tower:.3g} parameters; the advisor models at most "
                               f"{MAX_PARAMS:.0e}")
    return arch


def known_presets() -> list[str]:
    return sorted(p.name.removesuffix(".json") for p in PRESETS.iterdir() if p.name.endswith(".json"))


def load_architecture(preset_or_path: str) -> Architecture:
    """A preset name (`llama-2-7b`, alias `7B`), the path of a Hugging Face config.json, or a
    model folder holding one; a relative path that is not found here is taken from the repository."""
    if not preset_or_path.strip():
        raise ModelConfigError(f"no model given; known presets: {', '.join(known_presets())}")
    path = Path(preset_or_path)
    in_repo = REPO_ROOT / path
    if not path.exists() and ((in_repo.suffix == ".json" and in_repo.is_file()) or (in_repo / "config.json").is_file()):
        path = in_repo  # sweep files and run records name configs by repository path: any folder works
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelConfigError(f"model folder {path} holds no config.json")
        path = path / "config.json"
    if path.suffix == ".json" or path.exists():
        if not path.exists():
            raise ModelConfigError(f"model config not found: {path}")
        name = path.parent.name if path.name == "config.json" else path.stem
    else:
        name = ALIASES.get(preset_or_path, ALIASES.get(preset_or_path.upper(), preset_or_path.lower()))
        path = PRESETS / f"{name}.json"
        if not path.is_file():
            aliases = ", ".join(f"{k}={v}" for k, v in ALIASES.items())
            raise ModelConfigError(
                f"unknown model '{preset_or_path}'; known presets: {', '.join(known_presets())} (aliases {aliases})"
            )
    return architecture_from_config(read_json(path, ModelConfigError), name=name, origin=str(path))
