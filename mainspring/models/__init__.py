"""ChatModel: the one interface the agent runtime uses to talk to a model.

`LocalModel` runs the embedded engine (tool calling as the HTTP API does it: `mainspring.tool_calls`);
`OpenAICompatibleModel` calls any OpenAI-compatible /v1/chat/completions endpoint. Both take
OpenAI-shaped messages and tools and return the same `Completion` with the engine's normalized
`Usage`, so billing prices a run the same way whichever model served it.
"""

from mainspring.models.base import (ChatModel, Completion, CompletionChunk, Message, ModelStopped, Tool, ToolCall,
                                    UpstreamError, Usage)
from mainspring.models.local import LocalModel
from mainspring.models.openai_compatible import OpenAICompatibleModel

__all__ = ["ChatModel", "Completion", "CompletionChunk", "LocalModel", "Message", "ModelStopped",
           "OpenAICompatibleModel", "Tool", "ToolCall", "UpstreamError", "Usage"]
