"""LLMEngine: requests in, tokens out; one `step()` = schedule, forward, sample, detokenize."""

from __future__ import annotations

import itertools
import logging
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence as Seq, cast

import torch
from rich.progress import Progress

from mainspring.config import Settings, get_settings
from mainspring.engine.allocator import keep_freed_memory, release_freed_memory
from mainspring.engine.config import EngineConfig, ModelConfig
from mainspring.engine.detokenizer import IncrementalDetokenizer
from mainspring.engine.errors import InvalidRequestError
from mainspring.engine.grammar import GrammarCompiler, GrammarMatcher
from mainspring.engine import native_ops
from mainspring.engine.huge_pages import HugePageReport, place_weights
from mainspring.engine.kv_cache import BlockManager
from mainspring.engine.kv_offload import DiskKVCache, DiskKVTier, model_fingerprint
from mainspring.engine.kv_policy import KVPolicy, request_policy
from mainspring.engine.loader import LoadedModel, load_model
from mainspring.engine.kernel_choice import choose_linear_kernel
from mainspring.engine.linear_kernel import pack_linears, pack_weights_into, plain_linears
from mainspring.engine.model import CausalLM
from mainspring.engine.decode_graphs import GraphMode
from mainspring.engine.model_runner import ModelRunner, kv_bytes_per_block
from mainspring.engine.outputs import RequestOutput, TokenLogprob, TopLogprob, Usage
from mainspring.engine.params import SamplingParams
from mainspring.engine.sampler import SampleLogprobs, Sampler, score_tokens
from mainspring.engine.scheduler import ScheduledSeq, Scheduler
from mainspring.engine.sequence import Sequence, SequenceStatus
from mainspring.engine.placement import PlacementError, check_supported, resolve_placement
from mainspring.engine.quant_cache import quantize_for_engine
from mainspring.engine.speculative import SpeculativeDecoder
from mainspring.engine.tokenizer import Tokenizer

if TYPE_CHECKING:
    from mainspring.engine.kernel_choice import KernelChoice

log = logging.getLogger(__name__)
Prompt = str | list[int]


@dataclass
class _Request:
    seq: Sequence
    detok: IncrementalDetokenizer
    logprobs: list[TokenLogprob] | None = None
    prompt_logprobs: list[TokenLogprob | None] | None = None  # position 0 has none (nothing before it)
    stop_reason: str | int | None = None
    matcher: GrammarMatcher | None = None  # guided decoding; dropped with the request


class LLMEngine:
    def __init__(self, loaded: LoadedModel, config: EngineConfig | None = None,
                 share_prefill_with: LLMEngine | None = None) -> None:
        """`share_prefill_with`: an engine built from the same `loaded` whose dense linears run this one's int4
        layers' prefill rows where they hold the same weight (engine/shared_prefill.py; the -fast engine's)."""
        self.config = config or EngineConfig()
        if self.config.threads:
            torch.set_num_threads(self.config.threads)
        keep_freed_memory()  # activations reuse freed pages instead of faulting new ones (allocator.py)
        self.name = loaded.name
        self.model_config: ModelConfig = loaded.config
        self.tokenizer: Tokenizer = loaded.tokenizer
        self.placement = resolve_placement(self.config.device, self.config.dtype)
        check_supported(self.placement, quantization=self.config.quantization)
        on_cuda = self.placement.device.type == "cuda"
        # quantized weights come from the fp32 ones in every precision (one cached form per model): the model is
        # built in fp32 on the CPU, quantized for the device, then placed there in the engine's dtype
        quantizing = self.config.quantization is not None
        self.model = CausalLM.from_weights(loaded.config, loaded.state_dict,
                                           torch.float32 if quantizing else self.placement.dtype)
        if on_cuda and not quantizing:
            self.model.to(self.placement.device)
        # int4 weight-only linears when asked (cached on disk), before the runner and the drafter see the model
        shared = dict(share_prefill_with.model.named_modules()) if share_prefill_with is not None and not on_cuda \
            and share_prefill_with.placement.device == self.placement.device else None
        self.quant_report = quantize_for_engine(self.model, loaded.path, self.config.quantization,
                                                self.config.quant_group_size,
                                                dense_prefill=self.config.quant_dense_prefill, shared=shared,
                                                device=self.placement.device)
        if quantizing:
            self.model.place(self.placement.device, self.placement.dtype)
        # the linears left in the model's dtype run on the fastest kernel of this CPU (oneDNN or MKL prepacked, or
        # torch's): fp32, or bf16 where oneDNN packs it (AMX or AVX512-BF16: MKL has no bf16 GEMM to fall back on)
        dtype = self.placement.dtype
        shapes = [(m.out_features, m.in_features) for m in plain_linears(self.model, dtype).values()]
        self.linear_kernel = "torch" if on_cuda else choose_linear_kernel(self.config.linear_kernel, shapes, dtype,
                                                                          get_settings().cache_dir)
        if self.linear_kernel != "torch":
            pack_linears(self.model, dtype, self.linear_kernel)
        # after packing, the weights this engine made (fused, quantized): where a decode step will stream them
        if on_cuda:
            self.huge_pages = HugePageReport(reason="weights on the GPU")
        elif self.config.huge_pages:
            # the state dict's entries follow: another engine built from it shares these. Packs collapse before the
            # engine serves: on a background thread the first workload after start ran at half speed (12.5 against
            # ~26 tok/s single-stream through HTTP, Xeon capped at AVX2) while they did
            self.huge_pages = place_weights(self.model, loaded.state_dict)
        else:
            self.huge_pages = HugePageReport(reason="MAINSPRING_HUGE_PAGES off")
        # the small ops of decode steps on compiled kernels where this CPU and a C compiler allow (native_ops.py)
        if on_cuda:
            self.fused_ops, self.fused_ops_status = None, "off: weights on the GPU"
        elif not self.config.native_kernels:
            self.fused_ops, self.fused_ops_status = None, "off: MAINSPRING_NATIVE_KERNELS off"
        else:
            self.fused_ops, self.fused_ops_status = native_ops.load(get_settings().cache_dir)
        native_ops.attach(self.model, self.fused_ops)
        self.kernel_choice: KernelChoice | None = None  # how the -fast variant chose its weights (fast_variant.py)
        self.max_model_len = min(self.config.max_model_len or loaded.config.max_position_embeddings,
                                 loaded.config.max_position_embeddings)
        bs = self.config.block_size
        num_blocks = self.config.num_blocks or max(
            1, self.config.kv_cache_mb * 2**20 // kv_bytes_per_block(self.model, bs))
        self.block_manager = BlockManager(num_blocks, bs, self.config.enable_prefix_caching)
        self.scheduler = Scheduler(self.config, self.block_manager)
        self.kv_policy = self.config.kv_policy.default if self.config.kv_policy else KVPolicy()
        cold = self._cold_store(num_blocks)
        self.block_manager.cold_store = cold
        self.runner = ModelRunner(self.model, num_blocks, bs, cold, self._graph_mode(), self.config.max_num_seqs,
                                  self.max_model_len)
        self.runner.warmup()
        release_freed_memory()  # the dense weights packing and fusing replaced (~250 MB with oneDNN on SmolLM2)
        self.kv_disk = self._disk_tier(loaded)
        self.block_manager.disk = self.kv_disk
        self.sampler = Sampler(self.tokenizer.eos_token_ids)
        self.spec: SpeculativeDecoder | None = None
        if self.config.speculative:
            self.spec = SpeculativeDecoder(self.config.speculative, self.sampler, self.model, self.runner.kv_cache, bs)
            self.scheduler.num_lookahead_tokens = self.spec.k
        log.info("engine ready: %s on %s in %s, %d KV blocks of %d tokens (%d tokens), context %d, linears on %s, "
                 "fused kernels %s, %s", self.name, self.placement.device, self.placement.dtype_name, num_blocks, bs,
                 num_blocks * bs, self.max_model_len, self.linear_kernel, self.fused_ops_status,
                 self.huge_pages.describe())
        self._requests: dict[str, _Request] = {}
        self._ids = itertools.count()
        self._grammar: GrammarCompiler | None = None  # built on the first guided request (~1 s)

    def _graph_mode(self) -> GraphMode | None:
        """How decode-only steps run (engine/decode_graphs.py): captured graphs on CUDA unless turned off."""
        mode = self.config.decode_graphs
        if mode == "auto":
            return "capture" if self.placement.device.type == "cuda" else None
        if mode == "capture" and self.placement.device.type != "cuda":
            raise PlacementError(f"decode_graphs='capture' needs CUDA; this engine runs on {self.placement.device}")
        return None if mode == "off" else mode

    def _cold_store(self, num_blocks: int):
        """The quantized cold tier, when the KV policy names one; as many blocks as fit in the
        same memory budget as the hot pool."""
        bits = self.config.kv_policy.cold_bits if self.config.kv_policy else None
        if bits is None:
            return None
        from mainspring.engine.kv_quant import ColdKVStore

        c = self.model_config
        group = min(32, c.head_dim)  # KIVI's value groups of 32 channels, or the whole head if smaller
        per_block = ColdKVStore.cost_per_token(c.num_hidden_layers, c.num_key_value_heads, c.head_dim,
                                               bits, self.config.block_size, group) * self.config.block_size
        n = max(1, int(self.config.kv_cache_mb * 2**20 // per_block))
        return ColdKVStore(c.num_hidden_layers, n, self.config.block_size, c.num_key_value_heads, c.head_dim,
                           bits, group, device=self.placement.device)

    def _disk_tier(self, loaded: LoadedModel) -> DiskKVTier | None:
        """The prefix cache's disk tier, when kv_disk_cache_mb asks for one. Its files are keyed by
        what makes the KV: the weights, the block layout and the quantization (int4 linears change
        every K and V), so another model or variant never reads them."""
        cfg, c = self.config, self.model_config
        if cfg.kv_disk_cache_mb <= 0 or not cfg.enable_prefix_caching:
            return None
        root = Path(cfg.kv_disk_dir) if cfg.kv_disk_dir else get_settings().cache_dir / "kv"
        variant = f"{cfg.quantization}-g{cfg.quant_group_size}" if self.quant_report is not None else ""
        shape = (c.num_hidden_layers, cfg.block_size, c.num_key_value_heads, c.head_dim)
        dtype = self.placement.dtype
        fingerprint = model_fingerprint(loaded.path, *shape, str(dtype).removeprefix("torch."), variant=variant)
        disk = DiskKVCache(root, fingerprint, cfg.kv_disk_cache_mb, block_shape=shape, dtype=dtype)
        log.info("KV disk tier: %s, %d blocks on disk, up to %d MB", disk.dir, len(disk), cfg.kv_disk_cache_mb)
        return DiskKVTier(disk, self.runner.cache, cfg.block_size)

    def flush_kv_cache(self) -> int:
        """Write every cached prefix block the disk tier lacks, so a restart finds them all (call at
        a clean shutdown, with no step running; a crash keeps only what eviction already wrote).
        Returns the blocks written; 0 without a disk tier."""
        if self.kv_disk is None:
            return 0
        return self.kv_disk.flush(self.block_manager.registered_blocks())

    def max_len(self, seq: Sequence) -> int:
        """Longest a sequence may grow: the model's context, or far past it under a sliding window."""
        if seq.kv_policy is not None and seq.kv_policy.bounded:
            return self.config.max_window_model_len
        return self.max_model_len

    @property
    def grammar(self) -> GrammarCompiler:
        if self._grammar is None:
            self._grammar = GrammarCompiler(self.tokenizer, self.model_config.vocab_size)
        return self._grammar

    @classmethod
    def from_settings(cls, settings: Settings | None = None, **overrides) -> "LLMEngine":
        s = settings or get_settings()
        config = EngineConfig.from_settings(s)
        for k, v in overrides.items():
            if not hasattr(config, k):
                raise TypeError(f"unknown engine option {k!r}")
            setattr(config, k, v)
        return cls(load_model(s.model, s.cache_dir), config)

    # -- requests ---------------------------------------------------------------------------
    def add_request(self, prompt: Prompt, params: SamplingParams | None = None, request_id: str | None = None,
                    priority: int = 0, cache_salt: str | None = None) -> str:
        params = params or SamplingParams()
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if not ids:
            raise InvalidRequestError("the prompt is empty: give at least one token")
        vocab = self.model_config.vocab_size
        if any(not 0 <= t < vocab for t in ids):
            raise InvalidRequestError(f"prompt token ids must be in [0, {vocab})")
        bad_bias = [t for t in params.logit_bias or () if t >= vocab]
        if bad_bias:
            raise InvalidRequestError(f"invalid sampling parameter logit_bias={bad_bias[0]}: token ids must be in "
                                      f"[0, {vocab}) for this model's vocabulary")
        if params.prompt_logprobs is not None:
            # a prefix-cache hit would skip computing those tokens, and with them their logits
            cache_salt = f"{cache_salt or ''}\x00prompt-logprobs-{uuid.uuid4().hex}"
        policy = request_policy(self.kv_policy, params.attention_window, params.attention_sinks,
                                params.kv_hot_tokens, self.runner.cold_store is not None, self.config.block_size,
                                params.kv_snap_tokens)
        if policy is not None:
            # past the window or the hot span, a policy's deeper-layer KV differs from dense KV:
            # its blocks must never serve (or be served by) a request under another policy
            cache_salt = f"{cache_salt or ''}\x00kv={policy.window},{policy.sink_tokens},{policy.hot_tokens}"
        seq = Sequence(request_id or "", ids, params, priority=priority, cache_salt=cache_salt, kv_policy=policy)
        if len(ids) >= self.max_len(seq):
            raise InvalidRequestError(
                f"the prompt has {len(ids)} tokens but the model's context is {self.max_len(seq)} tokens; "
                "shorten the prompt (at least one token must be left to generate), or give the request an "
                "attention_window to run past the trained context")
        request_id = request_id or f"req-{next(self._ids)}"
        if request_id in self._requests:
            raise InvalidRequestError(f"request id {request_id!r} is already in use")
        seq.request_id = request_id
        # compiled before queueing: an invalid schema / regex / grammar rejects the request here
        matcher = self.grammar.compile(params) if params.guided else None
        # the verifier's look-ahead slots and the draft's own gather assume dense attention
        if self.spec is not None and policy is None and self.spec.supports(params):
            seq.num_lookahead_tokens = self.spec.k
        self.scheduler.add(seq)
        self._requests[request_id] = _Request(
            seq, IncrementalDetokenizer(self.tokenizer, ids, params), [] if params.logprobs is not None else None,
            [None] * len(ids) if params.prompt_logprobs is not None else None, matcher=matcher)
        return request_id

    def abort(self, request_id: str) -> RequestOutput | None:
        req = self._requests.pop(request_id, None)
        if req is None:
            return None
        self.scheduler.abort(request_id)
        self.sampler.free(req.seq.seq_id)
        req.seq.finish_reason = "abort"
        return self._output(req, [], "", finished=True)

    def recover(self) -> bool:
        """After a step raised: abort every request, then whether the engine is whole again to serve new ones (no
        request left, every KV block free or merely cached)."""
        for request_id in list(self._requests):
            self.abort(request_id)
        return not self.has_unfinished() and self.block_manager.num_free_blocks == self.block_manager.num_blocks

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    @property
    def num_requests(self) -> int:
        return len(self._requests)

    # -- the step ---------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        sched = self.scheduler.schedule()
        ended = [self._end_outgrown(seq) for seq in sched.finished if seq.request_id in self._requests]
        if not sched.scheduled:
            return ended
        if self.spec is not None and self.scheduler.num_lookahead_tokens:
            self.spec.propose(sched.scheduled, self.max_model_len)
        prompt_hidden: dict[int, tuple[int, torch.Tensor]] = {}
        logits, seqs = self.runner.execute(sched.scheduled, prompt_hidden)
        if prompt_hidden:
            self._score_prompts(sched.scheduled, prompt_hidden)
        if self.spec is not None and any(s.spec_token_ids for s in seqs):
            new_tokens, raw_lps = self.spec.sample(logits, seqs, self._masks)
        else:
            sampled = self.sampler(logits, seqs, self._masks(seqs)) if seqs else None
            new_tokens = {s.seq_id: [t] for s, t in zip(seqs, sampled.token_ids)} if sampled else {}
            raw_lps = {s.seq_id: [lp] for s, lp in zip(seqs, sampled.logprobs)} if sampled else {}
        self.scheduler.postprocess(sched, new_tokens)
        self.runner.apply_kv_policy([s.seq for s in sched.scheduled if s.seq.kv_policy is not None
                                     and s.seq.status is SequenceStatus.RUNNING], self.block_manager)
        outputs = ended
        for seq in seqs:
            req = self._requests.get(seq.request_id)
            if req is None:
                continue
            tokens = new_tokens[seq.seq_id]
            lps: list[TokenLogprob | None] = [None] * len(tokens)
            if req.logprobs is not None:  # asked for: the sampler scored these tokens
                lps = [None if lp is None else self._token_logprob(t, lp) for t, lp in zip(tokens, raw_lps[seq.seq_id])]
            outputs.append(self._advance(req, tokens, lps))
        return outputs

    _SCORE_ROWS = 128  # prompt rows per LM-head slice: 128 x 49,152 fp32 logits are 25 MB

    @torch.inference_mode()
    def _score_prompts(self, scheduled: list[ScheduledSeq], prompt_hidden: dict[int, tuple[int, torch.Tensor]]
                       ) -> None:
        """prompt_logprobs: the logprob of each prompt token this step computed, given those before it.
        A recompute after preemption scores the same positions again, with the same values."""
        for s in scheduled:
            entry = prompt_hidden.get(s.seq.seq_id)
            req = self._requests.get(s.seq.request_id)
            if entry is None or req is None or req.prompt_logprobs is None:
                continue
            start, hidden = entry
            prompt, k = s.seq.prompt_token_ids, s.seq.params.prompt_logprobs or 0
            for a in range(0, hidden.shape[0], self._SCORE_ROWS):
                rows = hidden[a:a + self._SCORE_ROWS]
                targets = prompt[start + a + 1:start + a + 1 + rows.shape[0]]
                for j, raw in enumerate(score_tokens(self.model.compute_logits(rows), targets, [k] * len(targets))):
                    req.prompt_logprobs[start + a + 1 + j] = self._token_logprob(targets[j], raw)

    def _masks(self, seqs: list[Sequence]) -> dict[int, GrammarMatcher] | None:
        if self._grammar is None:  # no guided request ever: no per-step work
            return None
        reqs = self._requests
        masks = {i: r.matcher for i, s in enumerate(seqs)
                 if (r := reqs.get(s.request_id)) is not None and r.matcher is not None}
        return masks or None

    def _advance(self, req: _Request, tokens: list[int], lps: list[TokenLogprob | None]) -> RequestOutput:
        """Check the tokens postprocess just appended (one, or a run accepted by speculative
        decoding) in order, each as if it had come alone; the ones after a stop are dropped."""
        seq, p = req.seq, req.seq.params
        first_out = seq.num_output_tokens - len(tokens)  # output tokens before this step
        delta, kept = "", 0
        reason: str | None = None
        stop: str | int | None = None  # the stop token id or stop string that ended the request
        if p.max_tokens == 0:  # scoring the prompt only: the token sampled after it is dropped
            tokens, lps, reason = [], [], "length"
        for token, lp in zip(tokens, lps):
            kept += 1
            n_out = first_out + kept
            eos = token in self.tokenizer.eos_token_ids
            # A complete grammar ends the request ("stop") whatever min_tokens / ignore_eos say: nothing
            # else may follow; an EOS that completes it is dropped from the text like any stop token.
            # The mask only allows grammar tokens, so a rejected token means the matcher failed (e.g. a
            # parser limit): end the request without the token's text rather than decode unconstrained.
            grammar_end = rejected = False
            if req.matcher is not None:
                rejected = not req.matcher.accept(token)
                if rejected:
                    log.warning("request %s: grammar rejected token %d (%s); stopping", seq.request_id, token,
                                req.matcher.error)
                grammar_end = req.matcher.is_terminated()
            stop_token = (n_out >= p.min_tokens and (
                token in p.stop_token_ids or (not p.ignore_eos and eos))) or (grammar_end and eos) or rejected
            # like vLLM: a stop token's own text is not part of the output unless asked for
            delta += req.detok.add(token) if not stop_token or p.include_stop_str_in_output else ""
            if lp is not None and req.logprobs is not None:  # lp is None unless logprobs were asked for
                req.logprobs.append(lp)
            if stop_token:
                reason, stop = "stop", (token if token in p.stop_token_ids else None)
            elif req.detok.finished_by_stop:
                reason, stop = "stop", req.detok.stop_reason
            elif grammar_end:
                reason = "stop"
            elif n_out >= p.max_tokens or seq.num_prompt_tokens + n_out >= self.max_len(seq):
                reason = "length"
            if reason is not None:
                break
        if reason is not None:
            del seq.token_ids[seq.num_prompt_tokens + first_out + kept :]  # accepted past the stop
            if not req.detok.finished_by_stop:
                delta += req.detok.flush()  # text held back in case it began a stop string
            seq.finish_reason, req.stop_reason = reason, stop
            self.scheduler.finish(seq, reason)
            self.sampler.free(seq.seq_id)
            del self._requests[seq.request_id]
        return self._output(req, tokens[:kept], delta, finished=reason is not None)

    def _end_outgrown(self, seq: Sequence) -> RequestOutput:
        """The scheduler ended `seq`: it grew past the whole KV pool (finish_reason "length")."""
        req = self._requests.pop(seq.request_id)
        self.sampler.free(seq.seq_id)
        return self._output(req, [], req.detok.flush(), finished=True)

    def _output(self, req: _Request, delta_ids: list[int], delta_text: str, finished: bool) -> RequestOutput:
        seq = req.seq
        return RequestOutput(
            request_id=seq.request_id,
            prompt_token_ids=seq.prompt_token_ids,
            token_ids=list(seq.output_token_ids),
            text=req.detok.text,
            delta_token_ids=delta_ids,
            delta_text=delta_text,
            logprobs=list(req.logprobs) if req.logprobs is not None else None,
            prompt_logprobs=list(req.prompt_logprobs) if req.prompt_logprobs is not None else None,
            finished=finished,
            finish_reason=seq.finish_reason if finished else None,
            stop_reason=req.stop_reason if finished else None,
            usage=Usage(seq.num_prompt_tokens, seq.usage_cached_tokens or 0, seq.num_output_tokens),
        )

    def _token_logprob(self, token: int, raw: SampleLogprobs) -> TokenLogprob:
        chosen, top = raw
        text = self.tokenizer.token_text
        return TokenLogprob(token, text(token), chosen, tuple(TopLogprob(t, text(t), lp) for t, lp in top))

    # -- batch API --------------------------------------------------------------------------
    def update_weights(self, weights: dict[str, torch.Tensor]) -> tuple[int, int]:
        """Copy `weights` (plain parameter names) into the model in place, repacking packed linears, and drop the
        prefix cache (its KV came from the old weights); (tensors written, bytes). Only between requests."""
        if self.has_unfinished():
            raise RuntimeError("cannot sync weights while the engine has running requests")
        written = pack_weights_into(self.model, weights)
        if not self.block_manager.reset_prefix_cache():
            raise RuntimeError("cannot sync weights while the engine has running requests")
        return written

    def generate(self, prompts: Prompt | Seq[Prompt], params: SamplingParams | Seq[SamplingParams] | None = None,
                 use_tqdm: bool = False) -> list[RequestOutput]:
        """Runs every prompt to completion with continuous batching; outputs in prompt order."""
        # One prompt (text, or token ids: a list of ints) or several. A list is told by its first item,
        # which mypy cannot narrow on: hence the casts.
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            batch: list[Prompt] = [cast(Prompt, prompts)]
        else:
            batch = list(cast(Seq[Prompt], prompts))
        plist = params if isinstance(params, (list, tuple)) else [params or SamplingParams()] * len(batch)
        if len(plist) != len(batch):
            raise InvalidRequestError(f"got {len(plist)} sampling params for {len(batch)} prompts")
        ids = [self.add_request(p, sp) for p, sp in zip(batch, plist)]
        final: dict[str, RequestOutput] = {}
        with Progress(disable=not use_tqdm, transient=True) as bar:
            task = bar.add_task("generating", total=len(ids))
            while self.has_unfinished():
                for out in self.step():
                    if out.finished:
                        final[out.request_id] = out
                        bar.advance(task)
        return [final[i] for i in ids]

    def stats(self) -> dict:
        out = {"waiting": self.scheduler.num_waiting, "running": self.scheduler.num_running,
               "kv_blocks": self.block_manager.num_blocks, "kv_free_blocks": self.block_manager.num_free_blocks,
               "linear_kernel": self.linear_kernel, "fused_kernels": self.fused_ops_status,
               "device": str(self.placement.device),
               "weights_huge_page_mb": self.huge_pages.huge_bytes >> 20,
               "dtype": self.placement.dtype_name}
        if self.spec is not None:
            out.update(spec_draft_tokens=self.spec.num_draft_tokens, spec_accepted_tokens=self.spec.num_accepted_tokens)
        if self.kv_disk is not None:
            out.update(self.kv_disk.stats())
        cold = self.runner.cold_store
        if cold is not None:
            out.update(kv_cold_blocks=cold.num_blocks, kv_cold_free_blocks=cold.num_free_blocks, kv_cold_bits=cold.bits)
        graphs = self.runner.graphs
        if graphs is not None:
            out.update(decode_graphs=graphs.mode, decode_graphs_captured=len(graphs.graphs),
                       decode_graph_steps=graphs.replays, decode_graphs_failed=graphs.failed)
        return out

