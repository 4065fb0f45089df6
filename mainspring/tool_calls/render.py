"""Normalized messages -> the turns and `tools` argument a chat template gets.

A template that handles `tools` itself (Qwen2.5, Llama 3.1, ...) gets them as transformers passes
them. Any other template (SmolLM2's, ChatML) gets a system-prompt section that lists the tools as
JSON schemas and shows the exact JSON to emit inside <tool_call> tags, and earlier tool calls and
results of the conversation are written into the turns in that same format.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from mainspring.tool_calls.normalize import ToolChoice, ToolSpec

if TYPE_CHECKING:
    from mainspring.engine.tokenizer import Tokenizer

OPEN, CLOSE = "<tool_call>", "</tool_call>"


def template_handles_tools(chat_template: str | None) -> bool:
    return chat_template is not None and "tools" in chat_template


def _tools_section(tools: list[ToolSpec], choice: ToolChoice) -> str:
    listing = "\n".join(json.dumps({"name": t.name, "description": t.description, "parameters": t.parameters},
                                   ensure_ascii=False) for t in tools)
    if choice.mode == "named":
        when = f"Now call the function {choice.name}."
    elif choice.mode == "required":
        when = "Now call one of the functions."
    else:
        when = "Call a function only when it helps to answer; otherwise answer normally."
    return (f"# Tools\n\nYou can call the functions below, described as JSON schemas:\n<tools>\n{listing}\n</tools>\n\n"
            f"To call a function, reply with exactly this and nothing else, arguments as a JSON object:\n"
            f'{OPEN}\n{{"name": "<function name>", "arguments": {{...}}}}\n{CLOSE}\n\n{when}')


def _call_text(name: str, arguments: Any) -> str:
    return f'{OPEN}\n{json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)}\n{CLOSE}'


def template_messages(messages: list[dict[str, Any]], tools: list[ToolSpec], choice: ToolChoice,
                      chat_template: str | None) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """Normalized messages -> (what the chat template gets, its `tools` argument).

    Normalized message: {"role", "content": str, "tool_calls": [{"id", "name", "arguments"}],
    "tool_call_id", "name"}. With tool_choice "none" the tools are left out of the prompt.
    """
    shown = tools if choice.mode != "none" else []
    if template_handles_tools(chat_template):
        out = []
        for m in messages:
            m = dict(m)
            if m.get("tool_calls"):
                m["tool_calls"] = [{"id": c["id"], "type": "function",
                                    "function": {"name": c["name"], "arguments": c["arguments"]}}
                                   for c in m["tool_calls"]]
            out.append(m)
        schema = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                    "parameters": t.parameters}} for t in shown]
        return out, schema or None
    out = []
    for m in messages:
        role, content = m["role"], m.get("content") or ""
        if role == "assistant" and m.get("tool_calls"):
            calls = "\n".join(_call_text(c["name"], c["arguments"]) for c in m["tool_calls"])
            content = f"{content}\n{calls}" if content else calls
        elif role == "tool":
            # templates without tool support know only system/user/assistant turns
            role, content = "user", f"<tool_response name=\"{m.get('name') or ''}\">\n{content}\n</tool_response>"
        out.append({"role": role, "content": content})
    if shown:
        section = _tools_section(shown, choice)
        if out and out[0]["role"] == "system":
            # the tools before the system text: an agent's tools are fixed while its system prompt often carries
            # per-run context (a coding run's focus map), so the prompts of different runs share the longer
            # prefix in the prefix cache
            out[0] = {"role": "system", "content": f"{section}\n\n{out[0]['content']}"}
        else:
            out.insert(0, {"role": "system", "content": section})
    return out, None


def render_prompt(tokenizer: Tokenizer, messages: list[dict[str, Any]], tools: list[ToolSpec],
                  choice: ToolChoice) -> str:
    """The prompt text of normalized `messages` with `tools` offered under `choice`."""
    msgs, template_tools = template_messages(messages, tools, choice, tokenizer.chat_template)
    return tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tools=template_tools)
