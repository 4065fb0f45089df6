"""The quantized cold tier of the KV cache: error bounds of the KIVI-style layouts, the int4 packing,
the block pool, its storage cost, and attention over real K/V of the embedded model against fp32."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from mainspring.engine.attention import AttentionMetadata
from mainspring.engine.kv_quant import (
    ColdKVStore, dequantize_keys, dequantize_values, pack_int4, quantize_keys, quantize_values, unpack_int4,
)
from mainspring.engine.model import CausalLM
from mainspring.engine.model_runner import ModelRunner

BITS = [8, 4]
# data whose float16 scale/min would be off by many steps if rounded to nearest: far from zero with a
# small spread, and a spread so small its step is a float16 subnormal
DATA = {"normal": (1.0, 0.0), "offset": (0.01, 100.3), "tiny": (1e-6, 0.0)}


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got - want).norm() / want.norm()).item()


def within_half_a_step(x: torch.Tensor, deq: torch.Tensor, step: torch.Tensor) -> bool:
    """|x - deq| <= step / 2, up to fp32 rounding of the dequantization (a few ulps of |x|)."""
    return bool(((x - deq).abs() <= step / 2 * (1 + 1e-5) + 1e-6 * x.abs()).all())


# -- the quantized forms --------------------------------------------------------------------------
@pytest.mark.parametrize("data", DATA)
@pytest.mark.parametrize("bits", BITS)
def test_keys_round_trip_within_half_a_step_per_channel(bits, data):
    torch.manual_seed(0)
    spread, offset = DATA[data]
    k = torch.randn(2, 5, 16, 3, 64) * spread + offset  # [layers, blocks, block_size, KVH, D]
    q, scale, mn = quantize_keys(k, bits)
    assert q.dtype == torch.uint8 and q.shape == (2, 5, 16, 3, 64 * bits // 8)
    assert scale.dtype == mn.dtype == torch.float16 and scale.shape == mn.shape == (2, 5, 3, 64)
    deq = dequantize_keys(q, scale, mn, bits)
    assert deq.dtype == torch.float32 and deq.shape == k.shape
    assert within_half_a_step(k, deq, scale.float().unsqueeze(-3))
    # asymmetric: each channel of each block uses its lowest and highest code (min and max on the grid;
    # off it by float16 rounding of the min in the other cases)
    codes = unpack_int4(q) if bits == 4 else q
    if data == "normal":
        assert bool((codes.amin(-3) == 0).all()) and bool((codes.amax(-3) == (1 << bits) - 1).all())


@pytest.mark.parametrize("data", DATA)
@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("group", [32, 64])
def test_values_round_trip_within_half_a_step_per_token_group(bits, group, data):
    torch.manual_seed(1)
    spread, offset = DATA[data]
    v = torch.randn(2, 5, 16, 3, 64) * spread - offset
    q, scale, mn = quantize_values(v, bits, group)
    assert q.shape == (2, 5, 16, 3, 64 * bits // 8) and scale.shape == mn.shape == (2, 5, 16, 3, 64 // group)
    deq = dequantize_values(q, scale, mn, bits, group)
    assert deq.shape == v.shape
    step = scale.float().repeat_interleave(group, dim=-1)
    assert within_half_a_step(v, deq, step)
    codes = (unpack_int4(q) if bits == 4 else q).unflatten(-1, (64 // group, group))
    if data == "normal":
        assert bool((codes.amin(-1) == 0).all()) and bool((codes.amax(-1) == (1 << bits) - 1).all())


def test_int4_packing_is_exact_and_halves_the_bytes():
    pairs = torch.cartesian_prod(torch.arange(16), torch.arange(16)).to(torch.uint8)  # all 256 pairs
    codes = pairs.T.reshape(1, 512)  # first half low nibbles, second half high nibbles
    packed = pack_int4(codes)
    assert packed.shape == (1, 256) and torch.equal(packed.sort().values, torch.arange(256, dtype=torch.uint8)[None])
    assert torch.equal(unpack_int4(packed), codes)
    torch.manual_seed(2)
    codes = torch.randint(0, 16, (4, 7, 64), dtype=torch.uint8)
    assert torch.equal(unpack_int4(pack_int4(codes)), codes)
    # the layout load() relies on: channel i in the low nibble, channel i + D/2 in the high one
    assert torch.equal(pack_int4(codes)[..., 3], codes[..., 3] | codes[..., 35] << 4)


@pytest.mark.parametrize("bits", BITS)
def test_an_outlier_key_channel_leaves_the_other_channels_alone(bits):
    """Post-RoPE keys have a few channels ~100x the rest. Per channel (KIVI's key layout), the other
    channels keep exactly their own grid; per token, the outlier would set every channel's step."""
    torch.manual_seed(3)
    k = torch.randn(4, 16, 3, 64)
    outlier = k.clone()
    outlier[..., 5] *= 100
    others = torch.arange(64) != 5

    def per_channel(x):
        return dequantize_keys(*quantize_keys(x, bits), bits)

    def per_token(x):  # the value layout with one group over the whole head
        return dequantize_values(*quantize_values(x, bits, 64), bits, 64)

    clean = per_channel(k)
    assert torch.equal(per_channel(outlier)[..., others], clean[..., others])
    err_channel = rel_err(per_channel(outlier)[..., others], k[..., others])
    err_token = rel_err(per_token(outlier)[..., others], k[..., others])
    assert err_channel < (0.01 if bits == 8 else 0.1)
    assert err_token > 10 * err_channel


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("const", [0.0, 0.25, -3.0])
def test_constant_input_is_exact_and_finite(bits, const):
    """Zero range: the scale is guarded (no 0/0); a float16-representable constant comes back exactly."""
    x = torch.full((3, 16, 2, 64), const)
    kq, vq = quantize_keys(x, bits), quantize_values(x, bits, 32)
    assert all(bool(torch.isfinite(t).all()) and bool((t > 0).all()) for t in (kq.scale, vq.scale))
    assert torch.equal(dequantize_keys(*kq, bits), x)
    assert torch.equal(dequantize_values(*vq, bits, 32), x)


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="beyond the float16 range"):
        quantize_values(torch.full((16, 1, 64), -1e5), 8)
    with pytest.raises(ValueError, match="8 or 4 bits, got 2"):
        ColdKVStore(2, 4, 16, 3, 64, bits=2)
    with pytest.raises(ValueError, match="8 or 4 bits, got 3"):
        quantize_keys(torch.zeros(16, 1, 64), 3)
    for group in (48, 7, 0):
        with pytest.raises(ValueError, match=f"positive even divisor of head_dim 64, got {group}"):
            ColdKVStore(2, 4, 16, 3, 64, bits=8, value_group=group)


# -- the block pool -------------------------------------------------------------------------------
def test_allocate_and_free():
    store = ColdKVStore(2, 4, 16, 3, 64, bits=4)
    assert store.num_free_blocks == 4 and store.bits == 4 and store.num_blocks == 4 and store.block_size == 16
    ids = store.allocate(3)
    assert len(set(ids)) == 3 and set(ids) <= set(range(4)) and store.num_free_blocks == 1
    with pytest.raises(RuntimeError, match="cannot allocate 2 cold KV blocks: 1 of 4 free"):
        store.allocate(2)
    assert store.num_free_blocks == 1  # a failed allocation takes nothing
    with pytest.raises(ValueError, match="negative"):
        store.allocate(-1)
    store.free(ids[:1])
    with pytest.raises(ValueError, match=rf"cold block {ids[0]} is already free"):
        store.free([ids[1], ids[0]])
    with pytest.raises(ValueError, match="already free"):
        store.free([ids[1], ids[1]])
    with pytest.raises(ValueError, match=r"cold block id 4 out of range \[0, 4\)"):
        store.free([ids[1], 4])
    assert store.num_free_blocks == 2  # rejected frees free nothing, not even their valid ids
    store.free(ids[1:])
    assert store.num_free_blocks == 4 and sorted(store.allocate(4)) == [0, 1, 2, 3]


@pytest.mark.parametrize("bits", BITS)
def test_store_load_round_trip_keeps_blocks_and_layers_apart(bits):
    torch.manual_seed(4)
    layers, n, bs, kvh, d = 3, 6, 16, 2, 64
    store = ColdKVStore(layers, 10, bs, kvh, d, bits)
    # every (layer, block) its own offset, so a block or layer read from the wrong place is far off
    offset = (torch.arange(layers)[:, None] * 100 + torch.arange(n)[None, :] * 10).float()[..., None, None, None]
    k = torch.randn(layers, n, bs, kvh, d) + offset
    v = torch.randn(layers, n, bs, kvh, d) - offset
    ids = store.allocate(10)[::-1][:n]  # not 0..n-1, and stored in two calls
    store.store(torch.tensor(ids[:2]), k[:, :2], v[:, :2])
    store.store(torch.tensor(ids[2:]), k[:, 2:], v[:, 2:])
    order = [4, 0, 5, 2, 1, 3]
    for layer in range(layers):
        got_k, got_v = store.load(layer, torch.tensor([ids[i] for i in order]))
        assert got_k.shape == got_v.shape == (n * bs, kvh, d) and got_k.dtype == torch.float32
        want_k, want_v = k[layer, order].reshape(n * bs, kvh, d), v[layer, order].reshape(n * bs, kvh, d)
        # exactly the pure functions' result, and within half a step of the input
        assert torch.equal(got_k.view(n, bs, kvh, d), dequantize_keys(*quantize_keys(k[layer, order], bits), bits))
        assert torch.equal(got_v, dequantize_values(*quantize_values(want_v, bits), bits))
        tol = 0.03 if bits == 8 else 0.4  # > half a step of a randn block; << the 10 between blocks
        assert (got_k - want_k).abs().max() < tol and (got_v - want_v).abs().max() < tol
    # rewriting one block touches no other
    before = store.load(1, torch.tensor(ids))
    store.store(torch.tensor([ids[2]]), torch.zeros(layers, 1, bs, kvh, d), torch.zeros(layers, 1, bs, kvh, d))
    after = store.load(1, torch.tensor(ids))
    rows = torch.arange(n * bs) // bs != 2
    assert torch.equal(after[0][rows], before[0][rows]) and torch.equal(after[1][rows], before[1][rows])
    assert not bool(after[0][~rows].any()) and not bool(after[1][~rows].any())


# -- storage cost ---------------------------------------------------------------------------------
@pytest.mark.parametrize("bits,want,min_ratio", [(8, 13680, 2.0), (4, 7920, 3.5)])
def test_bytes_per_token(bits, want, min_ratio):
    """SmolLM2-135M shape (30 layers, 3 KV heads, head_dim 64), block 16, value groups of 32. Per layer
    and head: K codes 64 * bits / 8, K scale + min 2 x 2 x 64 / 16 = 16, V codes 64 * bits / 8, V scale
    + min 2 x 2 x 64 / 32 = 8. int8: 90 x 152 = 13,680 B (3.37x less than fp32); int4: 90 x 88 = 7,920 B (5.82x)."""
    fp32 = ColdKVStore.fp32_bytes_per_token(30, 3, 64)
    assert fp32 == 46080
    store = ColdKVStore(30, 2, 16, 3, 64, bits)
    assert store.bytes_per_token() == want
    assert fp32 / store.bytes_per_token() >= min_ratio
    pools = (store.k_q, store.k_scale, store.k_min, store.v_q, store.v_scale, store.v_min)
    assert sum(t.nbytes for t in pools) == want * 2 * 16  # what is allocated is what is counted


# -- attention over real K/V of the embedded model ------------------------------------------------
TEXT = (
    "A mainspring is a spiral torsion spring of metal ribbon that stores the energy which drives a mechanical "
    "watch or clock. Winding the timepiece, by turning a knob or key, coils the spring tighter; as it slowly "
    "unwinds, it turns the wheels of the going train, which in turn advance the hands. Early mainsprings were "
    "made of hardened steel, and they appeared in Europe in the fifteenth century, making the first portable "
    "clocks possible. Before that, clocks were driven by weights hanging on cords, which required a tall case "
    "and a fixed position, so a clock could not be carried from room to room, let alone in a pocket.\n\n"
    "The force of a spring is not constant: a fully wound spring pushes much harder than one that is nearly run "
    "down. Clockmakers spent centuries fighting this problem. The fusee, a cone-shaped pulley linked to the "
    "barrel by a fine chain, gave the spring more leverage as it weakened, so the train received a nearly even "
    "torque. The stackfreed, a cam with a spring-loaded roller, did a cruder version of the same job in German "
    "watches. Later, better escapements such as the lever escapement and the balance spring made the rate of a "
    "watch much less sensitive to the driving force, and the fusee slowly disappeared from all but the finest "
    "marine chronometers.\n\n"
    "Breaking springs were a constant nuisance. A spring that snapped while fully wound could release its energy "
    "in an instant, spinning the barrel and stripping the teeth of the wheels. Watchmakers answered with the "
    "going barrel, in which the spring is enclosed in a toothed drum that drives the train directly, and with "
    "recoiling clicks that let the barrel turn backwards a little. In the twentieth century, new alloys of "
    "cobalt, nickel and chromium replaced carbon steel. These springs do not rust, they hardly lose their "
    "strength with age, and they very rarely break, so the old fear of a broken mainspring has almost vanished.\n\n"
    "Automatic watches wind their own mainspring. A half-moon weight, the rotor, swings on a pivot as the wearer "
    "moves the arm, and a system of reversing wheels turns the swinging into steady winding. Because the spring "
    "could be overwound by a rotor that never stops, automatic watches use a slipping bridle: the outer end of "
    "the spring is not fixed to the barrel wall but presses against it, and when the spring is fully wound it "
    "slips round inside the barrel instead of tightening further. The power reserve of a typical modern watch "
    "is about two days, though some designs with several barrels in series run for a week or more.\n\n"
    "Today quartz crystals and atomic clocks keep far better time than any spring, yet mechanical watches remain "
    "popular. Collectors value the craft of the movement, the sweep of the seconds hand, and the idea that a small "
    "coil of metal, wound by hand each morning, can keep a day's time to within a few seconds. Repairers still "
    "clean, oil and replace mainsprings much as their predecessors did, and the basic design would be familiar "
    "to a clockmaker from three hundred years ago."
)


@pytest.mark.slow
def test_quantized_kv_attention_stays_close_to_fp32(embedded):
    """Attention of the last 16 queries over 608 real tokens (38 blocks of 16), every layer, with K/V
    from the runner's fp32 cache against the same K/V round-tripped through the cold store. Queries are
    the model's own: recomputed from each layer's qkv_proj on the hidden states the layer saw, with RoPE.
    Every block is quantized, the queries' own included (the engine keeps the recent window fp32, so
    this is the worst case). Relative L2 error of the attention output, measured max / mean over the 30
    layers: int8 0.0066 / 0.0052, int4 0.106 / 0.086 (0.091 / 0.054 with the last block left fp32).
    Bounds below are ~2x the measured max."""
    torch.manual_seed(5)
    cfg = embedded.config
    model = CausalLM.from_weights(cfg, embedded.state_dict)
    n_layers, h, kvh, d = cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    bs, blocks, nq = 16, 38, 16
    t = blocks * bs
    ids = embedded.tokenizer.encode(TEXT)
    assert len(ids) >= t
    runner = ModelRunner(model, blocks, bs)
    seen: dict[int, torch.Tensor] = {}  # layer -> attention input
    hooks = [layer.self_attn.register_forward_pre_hook(lambda m, args, i=i: seen.__setitem__(i, args[0]))
             for i, layer in enumerate(model.layers)]
    meta = AttentionMetadata.build([], [(list(range(blocks)), 0, t)], bs)
    with torch.inference_mode():
        model(torch.tensor(ids[:t]), torch.arange(t), runner.kv_cache, meta)
    for hook in hooks:
        hook.remove()
    k = torch.stack([kc[:t] for kc, _ in runner.kv_cache]).view(n_layers, blocks, bs, kvh, d)
    v = torch.stack([vc[:t] for _, vc in runner.kv_cache]).view(n_layers, blocks, bs, kvh, d)
    causal = torch.arange(t)[None, :] <= torch.arange(t - nq, t)[:, None]

    def attend(q, keys, values):  # [nq, H, D] over [t, KVH, D] -> [H, nq, D]
        return F.scaled_dot_product_attention(q.transpose(0, 1), keys.transpose(0, 1), values.transpose(0, 1),
                                              attn_mask=causal, scale=d**-0.5, enable_gqa=True)

    errs: dict[int, list[float]] = {}
    with torch.inference_mode():
        for bits in BITS:
            store = ColdKVStore(n_layers, blocks, bs, kvh, d, bits)
            cold = torch.tensor(store.allocate(blocks))
            store.store(cold, k, v)
            errs[bits] = []
            for layer in range(n_layers):
                x = seen[layer]
                q = model.layers[layer].self_attn.qkv_proj(x[-nq:])[:, : h * d].view(nq, h, d)
                (q,) = model.rope(torch.arange(t - nq, t), q)
                want = attend(q, k[layer].reshape(t, kvh, d), v[layer].reshape(t, kvh, d))
                errs[bits].append(rel_err(attend(q, *store.load(layer, cold)), want))
    mean = {bits: sum(e) / n_layers for bits, e in errs.items()}
    assert max(errs[8]) < 0.015 and mean[8] < 0.01
    assert max(errs[4]) < 0.2 and mean[4] < 0.15
    # quantization really happened, and 4 bits cost more than 8 (measured ~16x, in every layer)
    assert mean[8] > 1e-3 and all(e4 > e8 for e4, e8 in zip(errs[4], errs[8])) and mean[4] > 5 * mean[8]
