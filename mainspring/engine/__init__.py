"""The inference engine: weights in, tokens out. See README "What the engine does"."""

from mainspring.engine.async_engine import AsyncLLMEngine
from mainspring.engine.engine import LLMEngine
from mainspring.engine.errors import EngineError, InvalidRequestError, ModelLoadError, UnsupportedModelError
from mainspring.engine.outputs import RequestOutput, TokenLogprob, Usage
from mainspring.engine.params import SamplingParams

__all__ = [
    "AsyncLLMEngine", "EngineError", "InvalidRequestError", "LLMEngine", "ModelLoadError", "RequestOutput",
    "SamplingParams", "TokenLogprob", "Usage", "UnsupportedModelError",
]
