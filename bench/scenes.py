"""Scenes: warm render time of a 20-object scene and validation time of a 500-object scene.

Render: the shared renderer draws the scene's shadow map, 4x MSAA colour and ID buffer at 512x512
and reads both back (what `scene_render` does per call); "warm" = the context, shaders and meshes
already exist, so a frame costs only the draws and the readback. "Cold" is the first frame of the
process, EGL context creation included. Validation: `scenes.validate` (pydantic models + document
checks) on JSON text, beside `jsonschema` (draft 2020-12, schema only) on the same document.

    python bench/scenes.py [--frames 20] [--runs 10] [--threads 1]

With --loop: the refinement loop (mainspring/scenarios/scene3d/refine.py) over the 20 briefs with
the embedded model, all briefs concurrently on one engine: the constraint pass rate of the first
scene (one shot, the one-shot prompt) against the scene after at most --rounds JSON Patch
revisions, tokens and cost (built-in price sheet) per brief, and the prefix-cache hit rate of the
revision calls. --candidates N asks for N patches per revision round (the first greedy, the rest
sampled) and keeps the one the checker ranks best; every candidate's tokens are counted.
The feedback quotes the checker's verified repair of each failed constraint (repair.py);
--no-hints leaves them out; --ablation runs with them, then without. --base-url/--model run the same against an
OpenAI-compatible upstream.

    python bench/scenes.py --loop [--rounds 3] [--candidates 4] [--no-hints | --ablation] [--briefs a,b]
                                  [--base-url URL --model NAME]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from train import cpu_model  # noqa: E402  (the benches' one CPU model reader)

SHAPES = ("box", "sphere", "cylinder", "cone", "capsule", "torus")


def scene_doc(n_objects: int) -> dict:
    """A floor and n_objects - 1 primitives on a grid, each resting on the floor."""
    objects = [{"id": "floor", "shape": "plane", "size": [40, 40], "material": "floor"}]
    side = max(1, int((n_objects - 1) ** 0.5 + 0.999))
    for i in range(n_objects - 1):
        shape = SHAPES[i % len(SHAPES)]
        x, z = (i % side - side / 2) * 1.2, (i // side - side / 2) * 1.2
        obj = {"id": f"{shape}_{i}", "shape": shape, "material": ("red", "blue", "wood")[i % 3]}
        if shape == "box":
            obj.update(size=[0.6, 0.5, 0.4], position=[x, 0.25, z], rotation_deg=[0, 15 * i % 360, 0])
        elif shape == "sphere":
            obj.update(radius=0.3, position=[x, 0.3, z])
        elif shape == "torus":
            obj.update(radius=0.3, tube=0.08, position=[x, 0.08, z])
        else:
            obj.update(radius=0.25, height=0.7, position=[x, 0.35, z])
        objects.append(obj)
    extent = side * 0.6 + 1
    return {
        "schema": "scene/0.1",
        "materials": {"floor": {"color": [0.6, 0.58, 0.55]}, "red": {"color": [0.8, 0.1, 0.1]},
                      "blue": {"color": [0.1, 0.3, 0.8]}, "wood": {"color": [0.5, 0.3, 0.15]}},
        "objects": objects,
        "lights": [{"id": "sun", "type": "directional", "intensity": 3, "position": [3, 6, 4]}],
        "camera": {"position": [extent * 1.2, extent * 1.1, extent * 1.6], "look_at": [0, 0, 0]},
        "constraints": [{"type": "no_overlap"}, {"type": "no_floating"},
                        {"type": "visible_in_camera", "a": objects[1]["id"]}],
    }


def timed(fn, runs: int) -> dict:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return {"median_ms": round(statistics.median(times) * 1000, 2), "min_ms": round(min(times) * 1000, 2),
            "max_ms": round(max(times) * 1000, 2), "runs": runs}


def markdown(report: dict) -> str:
    r, v = report["render_20_objects_512px"], report["validate_500_objects"]
    return "\n".join([
        "| work | Mainspring | peer | ratio |", "|---|---|---|---|",
        f"| warm render, 20 objects, 512×512 colour + ID buffer | {r['warm']['median_ms']} ms median "
        f"(first frame {r['cold_first_frame_ms']} ms) | — | — |",
        f"| validate 500 objects ({v['json_bytes']:,} bytes) | {v['mainspring']['median_ms']} ms | "
        f"jsonschema alone {v['jsonschema_only']['median_ms']} ms | {v['speedup']}× |",
        f"\n{report['renderer']}, {report['llvmpipe_threads']} llvmpipe thread(s), load average "
        f"{report['load_average_end'][0]}; `{report['command']}`"])


def run_loop(model, rounds: int, candidates: int = 1, hints: bool = True, only: str = "") -> dict:
    """Every brief through the loop on `model` (a ChatModel); per-brief rows and the totals."""
    import asyncio

    from mainspring.billing.prices import load_price_sheet, price
    from mainspring.billing.usage import UsageRecord
    from mainspring.scenarios.scene3d import load_briefs
    from mainspring.scenarios.scene3d.refine import RefineConfig, refine

    briefs = [b for b in load_briefs() if not only or b.id in only.split(",")]
    config = RefineConfig(max_rounds=rounds, candidates=candidates, repair_hints=hints)

    async def every_brief():
        return await asyncio.gather(*(refine(model, b, config) for b in briefs))

    t = time.perf_counter()
    results = asyncio.run(every_brief())
    wall = time.perf_counter() - t
    sheet = load_price_sheet(None)
    priced = model.model in sheet.models
    rows = []
    for brief, r in zip(briefs, results):
        cost_u = sum(price(UsageRecord(model.model, x.prompt_tokens, x.cached_tokens, 0, x.completion_tokens),
                           sheet).total_u for x in r.rounds) if priced else None
        first, final = r.first, r.final
        rows.append({"brief": brief.id, "constraints": len(brief.constraints),
                     "first_valid": bool(first and first.valid), "final_valid": bool(final and final.valid),
                     "first_passed": first.num_passed if first and first.valid else 0,
                     "final_passed": final.num_passed if final and final.valid else 0,
                     "stop_reason": r.stop_reason, "revisions": sum(x.kind == "patch" for x in r.rounds),
                     "applied": sum(x.applied for x in r.rounds[1:]),
                     "refused": [x.error for x in r.rounds[1:] if x.error], **r.spend.to_dict(),
                     "cost_usd": None if cost_u is None else cost_u / 1e6})
    n = sum(row["constraints"] for row in rows)
    revision_calls = [x for r in results for x in r.rounds[1:]]
    rev_prompt = sum(x.prompt_tokens for x in revision_calls)
    rev_cached = sum(x.cached_tokens for x in revision_calls)
    first_rate = sum(row["first_passed"] for row in rows) / n
    final_rate = sum(row["final_passed"] for row in rows) / n
    return {"model": model.model, "rounds": rounds, "candidates": candidates, "repair_hints": hints,
            "briefs": len(rows), "constraints": n,
            "pass_rate_one_shot": round(first_rate, 4), "pass_rate_loop": round(final_rate, 4),
            "gain_points": round((final_rate - first_rate) * 100, 1),
            "briefs_all_pass_one_shot": sum(row["first_passed"] == row["constraints"] for row in rows),
            "briefs_all_pass_loop": sum(row["final_passed"] == row["constraints"] for row in rows),
            "valid_one_shot": sum(row["first_valid"] for row in rows),
            "valid_loop": sum(row["final_valid"] for row in rows),
            "revision_calls": len(revision_calls), "revision_answers": sum(x.candidates for x in revision_calls),
            "chosen_not_first": sum(x.applied and x.chosen > 0 for x in revision_calls),
            "revisions_applied": sum(x.applied for x in revision_calls),
            "prefix_cache_hit_rate_revisions": round(rev_cached / rev_prompt, 4) if rev_prompt else 0.0,
            "tokens_per_brief": round(sum(row["total_tokens"] for row in rows) / len(rows), 1),
            "completion_tokens_per_brief": round(sum(row["completion_tokens"] for row in rows) / len(rows), 1),
            "cost_per_brief_usd": (round(sum(row["cost_usd"] for row in rows) / len(rows), 8) if priced else None),
            "wall_s": round(wall, 1), "rows": rows}


def loop_markdown(report: dict) -> str:
    lines = ["| model | constraint pass rate, one shot | after ≤ {r} revisions | gain | briefs passing | "
             "tokens / brief | cost / brief | prefix-cache hit, revisions |".format(r=report["rounds"]),
             "|---|---|---|---|---|---|---|---|"]
    for run in report["runs"]:
        cost = "—" if run["cost_per_brief_usd"] is None else f"${run['cost_per_brief_usd']:.6f}"
        per_round = f", {run['candidates']} candidates a round" if run.get("candidates", 1) > 1 else ""
        per_round += "" if run.get("repair_hints", True) else ", no repair hints"
        lines.append(f"| {run['model']}{per_round} | {run['pass_rate_one_shot']:.1%} | {run['pass_rate_loop']:.1%} | "
                     f"{run['gain_points']:+.1f} points | {run['briefs_all_pass_one_shot']} → "
                     f"{run['briefs_all_pass_loop']} | {run['tokens_per_brief']:.0f} | {cost} | "
                     f"{run['prefix_cache_hit_rate_revisions']:.1%} |")
    walls = " / ".join(f"{run['wall_s']}" for run in report["runs"])
    lines.append(f"\n{report['cpu']}, {report['threads']} torch threads, {walls} s for the "
                 f"{report['runs'][0]['briefs']} briefs (a row each); `{report['command']}`")
    return "\n".join(lines)


def loop_main(args) -> None:
    sys.path.insert(0, str(ROOT))
    import torch

    from mainspring.config import Settings
    from mainspring.engine.async_engine import AsyncLLMEngine
    from mainspring.engine.config import EngineConfig
    from mainspring.engine.engine import LLMEngine
    from mainspring.engine.loader import load_model
    from mainspring.models.local import LocalModel

    torch.set_num_threads(args.torch_threads)
    engine = AsyncLLMEngine(LLMEngine(load_model("smollm2", Settings().cache_dir),
                                      EngineConfig(kv_cache_mb=1024, max_num_batched_tokens=2048)))
    try:
        local = LocalModel(engine)
        runs = [run_loop(local, args.rounds, args.candidates, not args.no_hints, args.briefs)]
        if args.ablation and not args.no_hints:
            runs.append(run_loop(local, args.rounds, args.candidates, False, args.briefs))
    finally:
        engine.close()
    if args.base_url:
        from mainspring.models.openai_compatible import OpenAICompatibleModel

        runs.append(run_loop(OpenAICompatibleModel(args.base_url, os.environ.get("OPENAI_API_KEY"), args.model),
                             args.rounds, args.candidates, not args.no_hints, args.briefs))
    report = {"cpu": cpu_model(), "cpu_count": os.cpu_count(), "threads": args.torch_threads,
              "rounds": args.rounds, "runs": runs, "load_average_end": [round(x, 2) for x in os.getloadavg()],
              "command": "python bench/scenes.py " + " ".join(sys.argv[1:])}
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    for run in runs:
        print(f"{run['model']}: constraint pass rate one shot {run['pass_rate_one_shot']:.1%} -> after <= "
              f"{args.rounds} revisions {run['pass_rate_loop']:.1%} ({run['gain_points']:+.1f} points); briefs "
              f"passing {run['briefs_all_pass_one_shot']} -> {run['briefs_all_pass_loop']}; "
              f"{run['tokens_per_brief']:.0f} tokens/brief; prefix-cache hit rate of revisions "
              f"{run['prefix_cache_hit_rate_revisions']:.1%}; {run['wall_s']} s")
    print(f"wrote {args.out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--frames", type=int, default=20)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1, help="llvmpipe threads (LP_NUM_THREADS)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "scenes.json"))
    ap.add_argument("--update-readme", action="store_true", help="write the table from --out into README.md")
    ap.add_argument("--loop", action="store_true", help="the refinement loop over the 20 briefs (see above)")
    ap.add_argument("--rounds", type=int, default=3, help="--loop: revisions after the first scene")
    ap.add_argument("--candidates", type=int, default=1, help="--loop: patches asked for per revision round")
    ap.add_argument("--no-hints", action="store_true", help="--loop: without the checker's verified repairs")
    ap.add_argument("--ablation", action="store_true", help="--loop: then the same without the repairs")
    ap.add_argument("--briefs", default="", help="--loop: only these brief ids (comma-separated)")
    ap.add_argument("--torch-threads", type=int, default=2, help="--loop: torch threads of the embedded engine")
    ap.add_argument("--base-url", default="", help="--loop: also an OpenAI-compatible upstream (OPENAI_API_KEY)")
    ap.add_argument("--model", default="", help="--loop: the upstream's model name")
    args = ap.parse_args()
    if args.loop:
        if args.out == str(ROOT / "bench" / "results" / "scenes.json"):
            args.out = str(ROOT / "bench" / "results" / "scenes_loop.json")
        if args.update_readme:
            sys.path.insert(0, str(ROOT / "bench"))
            from readme_table import write_table

            write_table("scenes_loop", args.out, loop_markdown)
            return
        loop_main(args)
        return
    if args.update_readme:
        sys.path.insert(0, str(ROOT / "bench"))
        from readme_table import write_table

        write_table("scenes", args.out, markdown)
        return
    os.environ["LP_NUM_THREADS"] = str(args.threads)  # read by Mesa when the context is created
    sys.path.insert(0, str(ROOT))

    import jsonschema

    from mainspring.scenes import scene_json_schema, validate
    from mainspring.scenes.checks import check_constraints
    from mainspring.scenes.preview import renderer_name, shared_renderer
    from mainspring.scenes.validate import load_scene
    from mainspring.scenes.world import build_world

    small = scene_doc(20)
    world = build_world(load_scene(small))
    t = time.perf_counter()
    renderer = shared_renderer()
    first = renderer.render(world)
    cold_ms = (time.perf_counter() - t) * 1000
    assert len(first.visible()) == 20, f"only {len(first.visible())} of 20 objects visible"
    render = timed(lambda: renderer.render(world), args.frames)
    checks = timed(lambda: check_constraints(build_world(load_scene(small)), frame=first), args.runs)

    big = json.dumps(scene_doc(500))
    assert validate(big) == []
    ours = timed(lambda: validate(big), args.runs)
    schema = jsonschema.Draft202012Validator(scene_json_schema())
    peer = timed(lambda: list(schema.iter_errors(json.loads(big))), args.runs)

    report = {
        "renderer": renderer_name(), "llvmpipe_threads": args.threads, "cpu_count": os.cpu_count(),
        "render_20_objects_512px": {"warm": render, "cold_first_frame_ms": round(cold_ms, 1),
                                    "triangles": sum(len(p.mesh.surface.faces) for p in world.placed)},
        "check_20_objects_ms": checks,
        "validate_500_objects": {"mainspring": ours, "jsonschema_only": peer,
                                 "speedup": round(peer["median_ms"] / ours["median_ms"], 2),
                                 "json_bytes": len(big)},
        "load_average_end": [round(x, 2) for x in os.getloadavg()],
        "command": "python bench/scenes.py " + " ".join(sys.argv[1:]),
    }
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    v = report["validate_500_objects"]
    print(f"renderer: {report['renderer']}, {args.threads} llvmpipe thread(s)")
    print(f"render 20 objects, 512x512 colour + ID buffer: warm {render['median_ms']} ms median "
          f"(min {render['min_ms']}), cold first frame {report['render_20_objects_512px']['cold_first_frame_ms']} ms")
    print(f"check 3 constraints on 20 objects (build + measure): {checks['median_ms']} ms median")
    print(f"validate 500 objects: mainspring {ours['median_ms']} ms vs jsonschema {peer['median_ms']} ms "
          f"({v['speedup']}x), {v['json_bytes']:,} bytes of JSON")
    print(f"load average at the end: {report['load_average_end']}; wrote {args.out}")


if __name__ == "__main__":
    main()
