"""Scenes: warm render time of a 20-object scene and validation time of a 500-object scene.

Render: the shared renderer draws the scene's shadow map, 4x MSAA colour and ID buffer at 512x512
and reads both back (what `scene_render` does per call); "warm" = the context, shaders and meshes
already exist, so a frame costs only the draws and the readback. "Cold" is the first frame of the
process, EGL context creation included. Validation: `scenes.validate` (pydantic models + document
checks) on JSON text, beside `jsonschema` (draft 2020-12, schema only) on the same document.

    python bench/scenes.py [--frames 20] [--runs 10] [--threads 1]
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--frames", type=int, default=20)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1, help="llvmpipe threads (LP_NUM_THREADS)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "scenes.json"))
    ap.add_argument("--update-readme", action="store_true", help="write the table from --out into README.md")
    args = ap.parse_args()
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
