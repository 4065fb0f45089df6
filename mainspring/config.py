"""The one place that reads the environment: every knob is a `MAINSPRING_*` variable."""

from __future__ import annotations

import os
import tempfile
from functools import lru_cache
from pathlib import Path

from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


def _default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "mainspring"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MAINSPRING_", extra="ignore")

    data_dir: Path = Field(default_factory=_default_data_dir, description="converted weights, database, logs")
    model: str = Field("smollm2", description="'smollm2' (embedded), a .gguf file or a Hugging Face folder")
    threads: int = Field(0, ge=0, description="torch intra-op threads; 0 = one per core")
    device: str = Field("auto", description="where the engine runs: 'auto' (CUDA when torch sees a GPU, else the "
                        "CPU), 'cpu', 'cuda' or 'cuda:N' (on CUDA quantization is int4 or int4-bf16 only)")
    dtype: str = Field("auto", description="precision of weights, activations and KV cache: 'auto' (bf16 on CUDA, "
                       "fp32 on the CPU), 'fp32', 'bf16' or 'fp16' (quantized layers are made from the fp32 "
                       "weights in every precision)")
    cuda_graphs: bool = Field(True, description="on CUDA, replay decode-only steps as captured CUDA graphs (batch "
                              "and context buckets, captured on first use; other steps run eagerly); no effect on the "
                              "CPU")
    host: str = "127.0.0.1"
    port: int = Field(8321, ge=1, le=65535)

    block_size: int = Field(16, ge=1, description="tokens per KV-cache block")
    kv_cache_mb: int = Field(1024, ge=1, description="memory for the paged KV cache")
    max_num_batched_tokens: int = Field(2048, ge=16, description="token budget of one engine step")
    max_num_seqs: int = Field(64, ge=1, description="most requests running at once")
    max_model_len: int = Field(0, ge=0, description="context limit; 0 = the model's own")
    enable_prefix_caching: bool = True
    kv_disk_cache_mb: int = Field(0, ge=0, description="disk for the prefix cache's second tier under "
                                  "<data_dir>/cache/kv: evicted KV blocks are reloaded instead of recomputed, "
                                  "and the cache survives a restart; 0 = off")
    quantization: str = Field("", description="weights of the standard engine: '' (those of MAINSPRING_DTYPE), "
                              "'int4', 'int4-bf16', 'int4-fp32', 'int8' or 'bf16' (on CUDA: int4 and int4-bf16)")
    linear_kernel: Literal["auto", "torch", "onednn", "mkl"] = Field(
        "auto", description="kernel of the fp32 linears: 'auto' (torch's, or oneDNN's or MKL's with prepacked "
        "weights: whichever is fastest on this CPU at 1 and 16 rows, timed at the first start and cached under "
        "the cache dir's kernels/), 'torch', 'onednn' or 'mkl'")
    huge_pages: bool = Field(True, description="on Linux, move the CPU engines' weights onto transparent huge "
                             "pages (2 MiB) at start: a decode step streams every weight, and 4 KiB pages slow "
                             "the stream (engine/huge_pages.py)")
    native_kernels: bool = Field(True, description="compile the fused fp32 kernels of engine/native/fused_ops.c "
                                 "(RMSNorm with its residual add, RoPE with the K/V write, SiLU x up; compiled with "
                                 "-mavx2 -mfma where the CPU has both, for the baseline vector unit elsewhere) "
                                 "with the C compiler on the PATH, once, under the cache dir's kernels/, and run "
                                 "decode steps' small ops on them (engine/native_ops.py)")
    speculative: str = Field("", description="speculative decoding of the standard engine, e.g. 'ngram:k=5,n=3', "
                             "'draft:layers=20,k=4' or a JSON object (engine/speculative.py); empty = off")
    kv_policy: str = Field("", description="KV policy of the standard engine, e.g. 'window=1024,sinks=4' or "
                           "'hot=256,bits=8' (engine/kv_policy.py); empty = dense fp32")
    fast_variant: bool = Field(True, description="serve '<model>-fast' on its own quantized + speculative engine")
    fast_kernel: str = Field("auto", description="weights of the -fast engine: 'auto' (measured per CPU at first "
                             "start, engine/kernel_choice.py), 'int4-bf16', 'bf16', 'int8', 'int4-fp32' or 'fp32'")
    fast_speculative: str = Field("", description="speculative decoding of the -fast engine, as `speculative` or "
                                  "'off'; empty = the measured default, n-gram k=5 n=3 (engine/fast_variant.py)")

    database_url: str = Field("", description="SQLAlchemy URL; empty = sqlite:///<data_dir>/mainspring.db")
    prices_file: str = Field("", description="price sheet YAML; empty = the built-in sheet")
    require_auth: bool = Field(False, description="API keys required on every request")
    rpm_limit: int = Field(0, ge=0, description="default requests per minute per key; 0 = unlimited")
    tpm_limit: int = Field(0, ge=0, description="default tokens per minute per key; 0 = unlimited")
    record_trace: str = Field("", description="append a privacy-safe JSONL trace of chat calls here; empty = off")
    upstreams_file: str = Field("", description="YAML of OpenAI-compatible upstream endpoints served as models")
    max_request_mb: float = Field(8.0, gt=0, description="largest request body (JSON routes); larger is a 413")
    max_upload_mb: float = Field(101.0, gt=0, description="largest request body of a /v1/files upload (multipart, "
                                 "so a little over the largest file); larger is a 413")
    db_busy_timeout_s: float = Field(30.0, gt=0, description="how long a database write waits for another "
                                     "process's lock; then the API answers 503 with Retry-After")

    sandbox_slots: int = Field(8, ge=1, le=256, description="sandboxed jobs at once (each slot has its own uid)")
    sandbox_uid_base: int = Field(640_000, ge=1000, description="host uid of sandbox slot 0 (slot n: base + n)")
    sandbox_dir: str = Field(
        default_factory=lambda: os.path.join(tempfile.gettempdir(), "mainspring-sandbox"),
        description="workspaces, slot locks and the sandbox's /etc (parents must be world-traversable)",
    )
    sandbox_profiles_file: str = Field("", description="YAML overriding or adding sandbox profiles")
    sandbox_bwrap: str = Field("", description="path to bwrap; empty = found on PATH")
    sandbox_insecure_local: bool = Field(False, description="DEVELOPMENT ONLY: run sandbox jobs without isolation")

    agent_max_runs: int = Field(64, ge=1, description="agent runs one server process drives at once")
    agent_lease_s: float = Field(30.0, gt=0, description="a worker's lease on a run; renewed every third of it")
    serve_agent_worker: bool = Field(True, description="the HTTP server also drives agent runs and plans (a worker "
                                     "and the plan scheduler in its process); false = only `mainspring worker` "
                                     "processes do")
    agent_http_fetch: bool = Field(False, description="offer the http_fetch tool to agents (off: no egress)")
    agent_http_allow_private: bool = Field(False, description="let http_fetch reach loopback and private hosts")
    agent_attach_roots: list[Path] = Field(
        default_factory=list, description='server folders runs may attach paths under, as JSON: \'["/srv/docs"]\'; '
        "empty = only files uploaded through /v1/files (by id); the data directory is never attachable")
    agent_workspace_copy_mb: int = Field(32, ge=1, description="run workspace copied into each code tool job")
    plan_max_running: int = Field(16, ge=1, description="tasks of all plans in flight at once, deployment-wide "
                                  "(the one plan scheduler dispatches up to this many runs)")
    plan_min_run_tokens_per_s: float = Field(
        0.0, ge=0, description="decode rate each plan task's run on the embedded engine should get: a task starts "
        "only while the engine's measured tokens/s over its runs in flight plus one stays at or above this (0 = off)")

    ray_address: str = Field("", description="Ray cluster for compute: 'auto' (one started on this machine), "
                             "'host:port' or 'ray://host:port', or 'local' (a private one); empty = no Ray")
    ray_compute: list[Literal["sandbox"]] = Field(
        default_factory=list, description="work placed on the Ray cluster by resource request, as JSON: "
        "[\"sandbox\"] runs sandbox jobs (code tools, scene renders) on its nodes, each in that node's own "
        "sandbox; empty = in this process")
    engine_replicas: int = Field(0, ge=0, description="engine replicas as Ray actors behind one router (needs "
                                 "ray_address); 0 = the engine runs in this process")
    replica_threads: int = Field(1, ge=1, description="torch threads (and Ray CPUs) of each engine replica")
    routing_policy: Literal["prefix", "round_robin", "least_loaded"] = Field(
        "prefix", description="how requests pick an engine replica: 'prefix' (the one holding the prompt's "
        "prefix, unless it is hot: cluster/prefix_router.py), 'round_robin' or 'least_loaded'")

    finetuned_dir: str = Field("", description="fine-tuned models served by the API, one Hugging Face folder each "
                               "named by its model id (ft:...); empty = <data_dir>/finetuned")
    finetuned_max_loaded: int = Field(2, ge=1, description="fine-tuned models kept loaded at once; the least "
                                      "recently used is unloaded to load another")
    finetuned_kv_cache_mb: int = Field(128, ge=1, description="KV cache of each loaded fine-tuned model")

    @field_validator("data_dir")
    @classmethod
    def _expand(cls, v: Path) -> Path:
        return v.expanduser()

    def resolved_threads(self) -> int:
        return self.threads or (os.cpu_count() or 1)

    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.data_dir / 'mainspring.db'}"

    @property
    def cache_dir(self) -> Path:
        return self.data_dir / "cache"

    @property
    def finetuned_path(self) -> Path:
        return Path(self.finetuned_dir).expanduser() if self.finetuned_dir else self.data_dir / "finetuned"


def get_settings() -> Settings:
    """The settings of the current environment, built once per distinct environment: a process
    reads its MAINSPRING_* variables once, and a test (or a CLI run) that changes them gets
    settings that follow, never a stale copy. Treat the object as read-only: it is shared."""
    return _settings_for(_environment())


def _environment() -> tuple[tuple[str, str], ...]:
    # what Settings() reads: the MAINSPRING_* variables (matched case-insensitively) and the
    # variables behind the default data directory
    return tuple(sorted((k, v) for k, v in os.environ.items()
                        if k.upper().startswith("MAINSPRING_") or k in ("HOME", "XDG_DATA_HOME")))


@lru_cache(maxsize=8)
def _settings_for(environment: tuple[tuple[str, str], ...]) -> Settings:
    return Settings()
