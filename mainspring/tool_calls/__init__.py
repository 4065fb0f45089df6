"""Tool calling, one way for every caller: the HTTP routes (OpenAI, Anthropic, Responses) and the
agents' `LocalModel` prompt the same model the same way and read its calls back the same way.

Four stages, one module each:
  normalize  tools, tool_choice and messages in any protocol's shape -> ToolSpec, ToolChoice and
             normalized messages ({"role", "content": str, "tool_calls": [{"id", "name", "arguments"}],
             "tool_call_id", "name"})
  render     normalized messages -> chat-template turns: a template that handles `tools` gets them
             natively; any other gets a system-prompt section and <tool_call> tags
  schema     the JSON schema a forced call must match, for guided decoding
  parse      model output -> (content, calls), a forced call cut off by max_tokens included, and a
             streaming holder that passes content through until the text may be a call

Bad tools or choices raise the engine's InvalidRequestError with `param` set; the API turns it
into a 400 naming that parameter.
"""

from mainspring.tool_calls.normalize import (ToolChoice, ToolSpec, anthropic_tool_choice, call_items, new_call_id,
                                             openai_messages, openai_tool_choice, openai_tools)
from mainspring.tool_calls.parse import (ParsedCall, ToolCallStream, cut_call, finish_reason, parse_answer,
                                         parse_tool_calls)
from mainspring.tool_calls.render import render_prompt, template_handles_tools, template_messages
from mainspring.tool_calls.schema import call_schema, guided_decoding

__all__ = ["ParsedCall", "ToolCallStream", "ToolChoice", "ToolSpec", "anthropic_tool_choice", "call_items",
           "call_schema", "cut_call", "finish_reason", "guided_decoding", "new_call_id", "openai_messages",
           "openai_tool_choice", "openai_tools",
           "parse_answer", "parse_tool_calls", "render_prompt", "template_handles_tools", "template_messages"]
