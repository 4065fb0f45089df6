"""Writing scenes with a model: the prompt, and one batched, schema-constrained generate call.

Constrained decoding uses scenes.decoding_schema(brief.objects): every output is a scene/0.1
document by construction (compact JSON, bounded lists, exactly the brief's object ids, constraints
that name only them), whatever the model's size; how good the scene is, is for the evaluator. One
shared system prompt means the engine's prefix cache computes it once for the whole batch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from mainspring.scenarios.scene3d.briefs import Brief
from mainspring.scenes.schema import decoding_schema

# The example shows the decoding schema's form at its shortest (no optional fields, one decimal
# where one will do): a small model copies what it sees, and each token it writes costs a decode
# step of the whole batch.
_EXAMPLE = {
    "schema": "scene/0.1",
    "objects": [
        {"id": "crate", "shape": "box", "size": [0.6, 0.6, 0.6], "position": [0, 0.3, 0]},
        {"id": "ball", "shape": "sphere", "radius": 0.1, "position": [0, 0.7, 0]},
    ],
    "camera": {"position": [1.5, 1.2, 2], "look_at": [0, 0.3, 0]},
    "constraints": [{"type": "on_top_of", "a": "ball", "b": "crate"}],
}

SYSTEM_PROMPT = (
    "You write 3D scenes as JSON in the scene/0.1 format. Units are metres, +Y is up, the floor is y = 0, "
    "and each position is the centre of its object. Shapes: box (size [x, y, z]), sphere (radius), "
    "cylinder and cone (radius, height). The camera looks from position to look_at.\n"
    "Example request: A green ball on a wooden crate. Use the ids: crate, ball.\n"
    "Example answer: " + json.dumps(_EXAMPLE, separators=(",", ":"))
)


def messages(brief: Brief) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": brief.request()}]


@dataclass
class Generated:
    brief: Brief
    text: str
    finish_reason: str | None
    completion_tokens: int

    def document(self) -> Any:
        """The parsed JSON (raises ValueError if the output was cut short)."""
        return json.loads(self.text)


def generate_scenes(engine, briefs: list[Brief], max_tokens: int = 512, temperature: float = 0.0,
                    seed: int | None = 0) -> list[Generated]:
    """One scene per brief, all in one batched call of `engine` (an LLMEngine)."""
    from mainspring.engine.params import SamplingParams

    prompts = [engine.tokenizer.apply_chat_template(messages(b)) for b in briefs]
    params = [SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed,
                             guided_json=decoding_schema(b.objects)) for b in briefs]
    outputs = engine.generate(prompts, params)
    return [Generated(b, o.text, o.finish_reason, o.usage.completion_tokens if o.usage else len(o.token_ids))
            for b, o in zip(briefs, outputs)]
