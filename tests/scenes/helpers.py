"""Small scenes built in tests: a floor-level box/sphere world with a camera looking at it."""

from __future__ import annotations

import copy
import json
import string
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer, decoders, models

from mainspring.engine.grammar import GrammarCompiler
from mainspring.engine.params import SamplingParams
from mainspring.engine.tokenizer import Tokenizer

from mainspring.scenes.validate import load_scene
from mainspring.scenes.world import World, build_world

DATA = Path(__file__).parent / "data"
CAMERA = {"position": [0.0, 1.5, 4.0], "look_at": [0.0, 0.5, 0.0], "yfov_deg": 50.0}


def living_room() -> dict:
    return json.loads((DATA / "living_room.json").read_text())


def box(oid: str, size, position, **extra) -> dict:
    return {"id": oid, "shape": "box", "size": list(size), "position": list(position), **extra}


def sphere(oid: str, radius: float, position, **extra) -> dict:
    return {"id": oid, "shape": "sphere", "radius": radius, "position": list(position), **extra}


def doc(*objects: dict, constraints=(), camera=None, **top) -> dict:
    return {"schema": "scene/0.1", "objects": [copy.deepcopy(o) for o in objects],
            "camera": copy.deepcopy(camera or CAMERA), "constraints": list(constraints), **top}


def world(document: dict, base_dir: Path | None = None) -> World:
    return build_world(load_scene(document, base_dir), base_dir)


def tiny_compiler() -> GrammarCompiler:
    chars = sorted(set(string.printable) - set("\x0b\x0c"))
    toks = ["<s>", "</s>", *chars]
    hf = HFTokenizer(models.BPE(vocab={t: i for i, t in enumerate(toks)}, merges=[]))
    hf.decoder = decoders.Fuse()
    hf.add_special_tokens(["<s>", "</s>"])
    return GrammarCompiler(Tokenizer(hf, bos_token="<s>", eos_token="</s>"), vocab_size=len(toks))


def accepts(compiler: GrammarCompiler, schema: dict, text: str) -> bool:
    """Whether llguidance lets `text` be generated, character by character, to the end."""
    matcher = compiler.compile(SamplingParams(guided_json=schema))
    for ch in text:
        if not matcher.accept(compiler._tokenizer.encode(ch)[0]):
            return False
    return matcher.is_accepting()
