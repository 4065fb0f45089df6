"""The 3D-creation scenario: plain-language scene briefs with machine-checkable constraints and
reference scenes (briefs/), an evaluator that scores any scene against its brief, the prompt for
generating a scene with constrained decoding, and the agent tools scene_validate / scene_render.
"""

from mainspring.scenarios.scene3d.briefs import Brief, load_briefs
from mainspring.scenarios.scene3d.evaluate import BriefScore, evaluate

__all__ = ["Brief", "BriefScore", "evaluate", "load_briefs"]
