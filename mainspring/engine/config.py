"""Model and engine configuration: what the weights are, and how the engine runs them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # the option modules import torch and the model (which imports this module)
    from mainspring.config import Settings
    from mainspring.engine.kv_policy import KVPolicyConfig
    from mainspring.engine.speculative import SpeculativeConfig

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "mistral")


@dataclass(frozen=True)
class ModelConfig:
    """Architecture hyper-parameters, in Hugging Face `config.json` vocabulary."""

    architecture: str  # "llama" | "qwen2" | "mistral"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None  # HF dict: rope_type llama3 / linear / dynamic ...
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # Qwen2: bias on q/k/v projections
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    @property
    def num_kv_groups(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads


@dataclass
class EngineConfig:
    """How the engine schedules and caches; filled from `Settings` by `LLMEngine`."""

    block_size: int = 16
    num_blocks: int = 0  # 0 = derive from kv_cache_mb
    kv_cache_mb: int = 1024
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 64
    max_model_len: int = 0  # 0 = the model's max_position_embeddings
    enable_prefix_caching: bool = True
    threads: int = 0
    # engine/placement.py: "auto" | "cpu" | "cuda[:N]", and "auto" | "fp32" | "bf16" | "fp16"
    device: str = "auto"
    dtype: str = "auto"
    extra: dict[str, Any] = field(default_factory=dict)
    # weight quantization (engine/quant.py), fp32 when None; "int4": group-wise int4 weight-only
    # linears, quantized once and cached under Settings.cache_dir/quant
    quantization: str | None = None
    quant_group_size: int = 32  # see quant.DEFAULT_GROUP_SIZE
    # int4 layers keep a dense copy of their dequantized weight for prefill rows (quant.Int4Linear): None only
    # where bf16 is native (a bf16 copy); True also elsewhere (an fp32 copy: prefill as fast as fp32's, for
    # the -fast engine, at the fp32 weights' memory)
    quant_dense_prefill: bool | None = None
    # kernel of the linears left fp32 (engine/linear_kernel.py): "auto" times torch's and the prepacked ones
    # (oneDNN's, MKL's) on this CPU; "torch" / "onednn" / "mkl" pin one
    linear_kernel: str = "auto"
    # the CPU weights on transparent huge pages (engine/huge_pages.py); the values are unchanged either way
    huge_pages: bool = True
    # speculative decoding (engine/speculative.py), off when None: SpeculativeConfig("ngram") or
    # SpeculativeConfig("draft", layers=20)
    speculative: SpeculativeConfig | None = None
    # KV policy default of every request and the cold tier (engine/kv_policy.py), dense fp32 when
    # None: KVPolicyConfig(KVPolicy(window=1024)) bounds KV by a sliding window + attention sinks;
    # KVPolicyConfig(KVPolicy(hot_tokens=256)) keeps the last 256 tokens fp32 and quantizes older
    # blocks (int8 cold tier); KVPolicyConfig(cold_bits=4) alone builds the cold tier for requests
    # that ask for it (kv_hot_tokens).
    kv_policy: KVPolicyConfig | None = None
    # longest sequence a windowed request may reach (its KV stays bounded; RoPE goes past training)
    max_window_model_len: int = 1 << 20
    # disk tier of the prefix cache (engine/kv_offload.py), off at 0: evicted prefix blocks are
    # written there and reloaded on reuse, and the cache survives a restart (flush_kv_cache)
    kv_disk_cache_mb: int = 0
    kv_disk_dir: str | None = None  # None = Settings.cache_dir / "kv"
    # decode-only steps as CUDA graphs (engine/decode_graphs.py): "auto" captures them on CUDA and runs the CPU
    # eagerly; "off"; "capture"; "static" runs the graphs' fixed shapes eagerly (how they are tested on the CPU)
    decode_graphs: Literal["auto", "off", "capture", "static"] = "auto"
    # fused fp32 kernels for the small ops of few-row CPU steps, compiled once (engine/native_ops.py)
    native_kernels: bool = True

    @classmethod
    def from_settings(cls, s: Settings) -> EngineConfig:
        """The engine options the `Settings` (MAINSPRING_* variables) ask for: where their text is
        parsed, so a bad value fails here with the option's name."""
        from mainspring.engine.kv_policy import KVPolicyConfig
        from mainspring.engine.speculative import SpeculativeConfig

        return cls(
            block_size=s.block_size, kv_cache_mb=s.kv_cache_mb, max_num_batched_tokens=s.max_num_batched_tokens,
            max_num_seqs=s.max_num_seqs, max_model_len=s.max_model_len,
            enable_prefix_caching=s.enable_prefix_caching, threads=s.resolved_threads(),
            device=s.device, dtype=s.dtype,
            speculative=SpeculativeConfig.parse(s.speculative),
            quantization=parse_quantization(s.quantization), linear_kernel=s.linear_kernel,
            huge_pages=s.huge_pages, native_kernels=s.native_kernels,
            kv_policy=KVPolicyConfig.parse(s.kv_policy),
            kv_disk_cache_mb=s.kv_disk_cache_mb, decode_graphs="auto" if s.cuda_graphs else "off",
            # these settings' data dir, not the environment's (create_app may be given its own)
            kv_disk_dir=str(s.cache_dir / "kv"),
        )


def parse_quantization(value: str | None) -> str | None:
    """The settings knob: "" / "none" / "fp32" -> None (fp32 weights); else the method, e.g. "int4"."""
    value = (value or "").strip().lower()
    return None if value in ("", "none", "fp32") else value
