"""Export: the trained policy as an HF folder the loader reads, and its LoRA adapter merged onto the base
gives the same weights; the engine sync writes exactly those weights."""

import torch

from mainspring.engine.config import EngineConfig
from mainspring.engine.engine import LLMEngine
from mainspring.engine.loader import LoadedModel, load_model
from mainspring.engine.params import SamplingParams
from mainspring.train.config import LoraSpec
from mainspring.train.export import apply_adapter, export_model
from mainspring.train.policy import Policy
from tests.train.tiny import tiny_config, tiny_state


def test_export_and_adapter_round_trip(embedded, tmp_path):
    cfg = tiny_config(vocab=embedded.config.vocab_size, hidden=32, context=256)
    base = LoadedModel("tiny", embedded.path, cfg, tiny_state(cfg), embedded.tokenizer)
    policy = Policy(cfg, base.state_dict, LoraSpec(r=4, alpha=8))
    with torch.no_grad():  # a trained adapter: B is zero at init, so move it
        for p in policy.trainable().values():
            p.add_(torch.randn_like(p) * 0.05)
    out = export_model(policy, base, tmp_path / "export", {"base": "tiny", "suffix": "t"})
    exported = load_model(out)
    merged = apply_adapter(base, out / "adapter")
    changed = 0
    for name, t in exported.state_dict.items():
        assert torch.allclose(t, merged.state_dict[name], atol=1e-6), name
        changed += not torch.allclose(t, base.state_dict[name])
    assert changed >= 4 * cfg.num_hidden_layers  # q/k/v/o/gate/up/down moved in every layer

    engine = LLMEngine(LoadedModel("tiny", base.path, cfg, {k: v.clone() for k, v in base.state_dict.items()},
                                   base.tokenizer), EngineConfig(kv_cache_mb=8))
    report = policy.sync_into(engine)
    assert report.tensors == 4 * cfg.num_hidden_layers  # the adapted linears only
    served = LLMEngine(exported, EngineConfig(kv_cache_mb=8))
    greedy = SamplingParams(temperature=0.0, max_tokens=8)
    a = engine.generate("Hello there", greedy)[0].token_ids
    b = served.generate("Hello there", greedy)[0].token_ids
    assert a == b  # the synced engine and the exported model are the same model
