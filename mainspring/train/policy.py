"""The policy being trained: the engine's own `CausalLM` with a dense (unpaged) causal forward for
training, LoRA adapters from peft or full weights, and the weight sync into the serving engine.

Why our model and not transformers': rollouts run on `LLMEngine`, so the trained weights must be the
engine's weights — same modules, same fused q/k/v and gate/up. The policy is its own copy (the engine
keeps serving while the policy trains); after each update `sync_into` copies what changed into the
engine's tensors in place (merged LoRA deltas, or every weight) and drops the engine's prefix cache,
whose KV was computed by the old weights.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F

from mainspring.engine.config import ModelConfig
from mainspring.engine.model import CausalLM, DecoderLayer
from mainspring.train.config import LoraSpec

ADAPTER = "default"


@dataclass
class SyncReport:
    seconds: float
    tensors: int
    bytes: int


class Policy:
    def __init__(self, cfg: ModelConfig, state_dict: dict[str, torch.Tensor], lora: LoraSpec | None,
                 keep_reference: bool = False) -> None:
        # a private copy: the engine's model adopts (shares) the loaded tensors
        self.model = CausalLM.from_weights(cfg, {k: v.clone() for k, v in state_dict.items()}).train()
        self.config = cfg
        self.lora = lora
        # the KL reference: under LoRA the base with adapters off; full weights need a frozen copy
        self.reference = CausalLM.from_weights(cfg, state_dict) if keep_reference and lora is None else None
        if lora is not None:
            from peft import LoraConfig, inject_adapter_in_model

            # peft annotates lora_alpha as int, yet only scales by alpha / r: a float alpha is exact
            inject_adapter_in_model(LoraConfig(r=lora.r, lora_alpha=lora.alpha,  # type: ignore[arg-type]
                                               lora_dropout=lora.dropout,
                                               target_modules=list(lora.targets)), self.model, adapter_name=ADAPTER)
            for name, p in self.model.named_parameters():
                p.requires_grad_("lora_" in name)
        else:
            self.model.requires_grad_(True)

    # -- parameters -------------------------------------------------------------------------------
    def trainable(self) -> dict[str, torch.nn.Parameter]:
        return {n: p for n, p in self.model.named_parameters() if p.requires_grad}

    def num_trainable(self) -> int:
        return sum(p.numel() for p in self.trainable().values())

    def trainable_state(self) -> dict[str, torch.Tensor]:
        return {n: p.detach().clone() for n, p in self.trainable().items()}

    @torch.no_grad()
    def load_trainable_state(self, state: dict[str, torch.Tensor]) -> None:
        params = self.trainable()
        if set(state) != set(params):
            missing, extra = sorted(set(params) - set(state)), sorted(set(state) - set(params))
            raise ValueError(f"checkpoint does not fit this policy: missing {missing[:3]}, unexpected {extra[:3]}")
        for n, p in params.items():
            if state[n].shape != p.shape:
                raise ValueError(f"checkpoint tensor {n}: shape {tuple(state[n].shape)} != {tuple(p.shape)}")
            p.copy_(state[n])

    def lora_layers(self):
        """(module name, peft LoRA layer) of every adapted linear."""
        from peft.tuners.lora import LoraLayer

        return [(n, m) for n, m in self.model.named_modules() if isinstance(m, LoraLayer)]

    @contextlib.contextmanager
    def adapters_disabled(self):
        """The frozen base model (the KL reference under LoRA costs no second copy)."""
        layers = [m for _, m in self.lora_layers()]
        for m in layers:
            m.enable_adapters(False)
        try:
            yield
        finally:
            for m in layers:
                m.enable_adapters(True)

    def merged_weights(self) -> dict[str, torch.Tensor]:
        """Engine-named tensors of the current policy (LoRA merged): what sync and export write."""
        with torch.no_grad():
            if self.lora is None:
                return {n: p.detach() for n, p in self.model.named_parameters()}
            out = {}
            for name, layer in self.lora_layers():
                out[name + ".weight"] = layer.base_layer.weight + layer.get_delta_weight(ADAPTER)
            return out

    @torch.no_grad()
    def sync_into(self, engine) -> SyncReport:
        """Copy the policy's weights into a running engine in place (`LLMEngine.update_weights`, or every replica's:
        cluster/rollout_replicas.py) and drop its prefix cache."""
        t0 = time.perf_counter()
        n, size = engine.update_weights(self.merged_weights())  # an LLMEngine, or rollout replicas on Ray
        return SyncReport(time.perf_counter() - t0, n, size)

    # -- the training forward ---------------------------------------------------------------------
    def _model_for(self, reference: bool):
        if not reference:
            return self.model, contextlib.nullcontext()
        if self.lora is not None:
            return self.model, self.adapters_disabled()
        if self.reference is not None:
            return self.reference, contextlib.nullcontext()
        raise RuntimeError("no reference model: build the Policy with keep_reference=True")

    def group_logprobs(self, prompt: torch.Tensor, completions: torch.Tensor, lengths: torch.Tensor,
                       reference: bool = False) -> torch.Tensor:
        """Log-probabilities [n, C] of n completions (right-padded, `lengths` real tokens each) of one
        prompt, 0 past each length. The prompt goes through the model once for all of them (GRPO's
        G samples share it), which is exact: its activations do not depend on what follows."""
        return self._group_forward(prompt, completions, lengths, reference, entropy=False)[0]

    def group_logprobs_and_entropy(self, prompt: torch.Tensor, completions: torch.Tensor,
                                   lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """group_logprobs, and the policy's entropy (nats, detached) at each completion position [n, C]:
        the entropy-collapse signal, from the logits the loss computes anyway."""
        lp, ent = self._group_forward(prompt, completions, lengths, False, entropy=True)
        assert ent is not None
        return lp, ent

    def _group_forward(self, prompt: torch.Tensor, completions: torch.Tensor, lengths: torch.Tensor,
                       reference: bool, entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        model, ctx = self._model_for(reference)
        with ctx:
            last, hidden = shared_prompt_forward(model, prompt, completions)
        n, c = completions.shape
        # token j is predicted from position j - 1: the prompt's last for j = 0
        pred = torch.cat([last.expand(n, 1, -1), hidden[:, :-1]], dim=1)
        valid = torch.arange(c)[None, :] < lengths[:, None]
        rows, cols = valid.nonzero(as_tuple=True)
        logits = model.compute_logits(pred[rows, cols]).float()
        log_probs = logits.log_softmax(-1)
        lp = log_probs.gather(-1, completions[rows, cols][:, None]).squeeze(-1)
        ent = None
        if entropy:
            with torch.no_grad():
                h = -(log_probs.detach().exp() * log_probs.detach()).sum(-1)
            ent = torch.zeros(n, c, dtype=h.dtype).index_put((rows, cols), h)
        return torch.zeros(n, c, dtype=lp.dtype).index_put((rows, cols), lp), ent

    def token_logprobs(self, input_ids: torch.Tensor, targets_from: torch.Tensor, lengths: torch.Tensor,
                       reference: bool = False) -> torch.Tensor:
        """Log-probabilities of tokens input_ids[b, t] for t >= targets_from[b] and t < lengths[b],
        as a [B, T] tensor (0 elsewhere). Rows are right-padded; position t is predicted from < t.
        `reference`: under the frozen starting model instead (the KL term)."""
        model, ctx = self._model_for(reference)
        with ctx:
            hidden = dense_forward(model, input_ids)  # [B, T, H]
        b, t = input_ids.shape
        pos = torch.arange(t)
        mask = (pos[None, :] >= targets_from[:, None]) & (pos[None, :] < lengths[:, None]) & (pos[None, :] > 0)
        rows, cols = mask.nonzero(as_tuple=True)
        # only the predicted positions go through the LM head (a fifth of the model's weights)
        logits = model.compute_logits(hidden[rows, cols - 1]).float()
        lp = logits.log_softmax(-1).gather(-1, input_ids[rows, cols][:, None]).squeeze(-1)
        out = torch.zeros(b, t, dtype=lp.dtype)
        return out.index_put((rows, cols), lp)


def _decoder_layers(model: CausalLM) -> Iterable[DecoderLayer]:
    return cast("Iterable[DecoderLayer]", model.layers)  # nn.ModuleList yields plain Modules to a type checker


def dense_forward(model: CausalLM, input_ids: torch.Tensor) -> torch.Tensor:
    """Final hidden states [B, T, H] of right-padded rows, causal attention, positions 0..T-1: the same
    modules as the engine's paged forward (so the same weights), with differentiable SDPA attention."""
    b, t = input_ids.shape
    positions = torch.arange(t)
    model.rope.ensure(positions)
    x = model.embed_tokens(input_ids)
    for layer in _decoder_layers(model):
        a = layer.self_attn
        h = layer.input_layernorm(x)
        q, k, v = a.qkv_proj(h).split([a.h * a.d, a.kvh * a.d, a.kvh * a.d], dim=-1)
        q, k = model.rope(positions, q.view(b, t, a.h, a.d), k.view(b, t, a.kvh, a.d))
        v = v.view(b, t, a.kvh, a.d)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           is_causal=True, scale=a.scale, enable_gqa=a.h != a.kvh)
        x = x + a.o_proj(o.transpose(1, 2).reshape(b, t, a.h * a.d))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return x


def shared_prompt_forward(model: CausalLM, prompt: torch.Tensor, completions: torch.Tensor):
    """(hidden state of the prompt's last token [H], hidden states of the completions [n, C, H]) for
    n completions of one prompt: the prompt's P tokens are computed once and every completion attends
    to them, so a group costs P + n*C token rows instead of n*(P + C)."""
    p, (n, c) = prompt.numel(), completions.shape
    positions = torch.cat([torch.arange(p), torch.arange(p, p + c).repeat(n)])
    model.rope.ensure(positions)
    x = model.embed_tokens(torch.cat([prompt, completions.flatten()]))  # [P + n*C, H]
    # a completion sees the whole prompt and itself causally
    mask = torch.ones(c, p + c, dtype=torch.bool)
    mask[:, p:] = torch.ones(c, c, dtype=torch.bool).tril()
    for layer in _decoder_layers(model):
        a = layer.self_attn
        q, k, v = a.qkv_proj(layer.input_layernorm(x)).split([a.h * a.d, a.kvh * a.d, a.kvh * a.d], dim=-1)
        q, k = model.rope(positions, q.view(-1, a.h, a.d), k.view(-1, a.kvh, a.d))
        v = v.view(-1, a.kvh, a.d)
        gqa = a.h != a.kvh
        o_p = F.scaled_dot_product_attention(q[:p].transpose(0, 1)[None], k[:p].transpose(0, 1)[None],
                                             v[:p].transpose(0, 1)[None], is_causal=True, scale=a.scale,
                                             enable_gqa=gqa)  # [1, H, P, D]
        keys = torch.cat([k[:p].expand(n, p, a.kvh, a.d), k[p:].view(n, c, a.kvh, a.d)], dim=1)
        vals = torch.cat([v[:p].expand(n, p, a.kvh, a.d), v[p:].view(n, c, a.kvh, a.d)], dim=1)
        o_c = F.scaled_dot_product_attention(q[p:].view(n, c, a.h, a.d).transpose(1, 2), keys.transpose(1, 2),
                                             vals.transpose(1, 2), attn_mask=mask, scale=a.scale,
                                             enable_gqa=gqa)  # [n, H, C, D]
        o = torch.cat([o_p[0].transpose(0, 1).reshape(p, -1), o_c.transpose(1, 2).reshape(n * c, -1)])
        x = x + a.o_proj(o)
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return x[p - 1], x[p:].view(n, c, -1)
