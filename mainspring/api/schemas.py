"""Request and response bodies of the OpenAI (chat, completions) and Anthropic (messages) APIs.

Requests accept unknown fields (`extra="allow"`) as the real services do: SDKs add fields over time
(`store`, `metadata`, `service_tier`, ...) and a client must not break on a server that is merely
older. Ranges that OpenAI documents are enforced here, so a bad value is a 400 naming the field.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from mainspring.engine.kv_policy import MAX_SPAN_TOKENS
from mainspring.engine.outputs import Usage

_LENIENT = ConfigDict(extra="allow", populate_by_name=True)


# ---- OpenAI requests ----------------------------------------------------------------------------
class ContentPart(BaseModel):
    model_config = _LENIENT
    type: str
    text: str | None = None


class FunctionCallIn(BaseModel):
    model_config = _LENIENT
    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCallIn(BaseModel):
    model_config = _LENIENT
    id: str | None = None
    type: str = "function"
    function: FunctionCallIn


class ChatMessage(BaseModel):
    model_config = _LENIENT
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None


class FunctionDef(BaseModel):
    model_config = _LENIENT
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(BaseModel):
    model_config = _LENIENT
    type: Literal["function"] = "function"
    function: FunctionDef


class StreamOptions(BaseModel):
    model_config = _LENIENT
    include_usage: bool = False


class JsonSchemaSpec(BaseModel):
    model_config = _LENIENT
    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    model_config = _LENIENT
    type: Literal["text", "json_object", "json_schema"] = "text"
    json_schema: JsonSchemaSpec | None = None


class SamplingFields(BaseModel):
    """Fields every OpenAI generation endpoint shares, plus vLLM's common extras (top_k, min_p, ...)."""

    model_config = _LENIENT
    model: str
    n: int = Field(1, ge=1, le=128)
    seed: int | None = Field(None, ge=-(2**63), lt=2**63)  # OpenAI's seeds are int64
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int | None = Field(None, ge=0)
    # Mainspring's KV policy per request (engine/kv_policy.py); 0 turns the engine default off.
    # A window lets the request run past the model's trained context in bounded memory.
    attention_window: int | None = Field(None, ge=0, le=MAX_SPAN_TOKENS)
    attention_sinks: int | None = Field(None, ge=0)
    kv_hot_tokens: int | None = Field(None, ge=0, le=MAX_SPAN_TOKENS)
    kv_snap_tokens: int | None = Field(None, ge=0, le=MAX_SPAN_TOKENS)
    # vLLM's constrained decoding (routes.vllm_guided); guided_grammar is Lark, as the engine takes it
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    structured_outputs: dict[str, Any] | None = None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    response_format: ResponseFormat | None = None
    tools: list[Tool] | None = None
    tool_choice: Any = None  # checked in tools.py, so a bad value gets a message that lists the valid ones
    parallel_tool_calls: bool | None = None


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(16, ge=0)  # OpenAI's default for this endpoint; 0 with echo scores a prompt
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = Field(None, ge=1)


# ---- OpenAI responses ---------------------------------------------------------------------------
class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class UsageOut(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails

    @classmethod
    def of(cls, u: Usage) -> UsageOut:
        return cls(prompt_tokens=u.prompt_tokens, completion_tokens=u.completion_tokens,
                   total_tokens=u.total_tokens,
                   prompt_tokens_details=PromptTokensDetails(cached_tokens=u.cached_tokens))


class FunctionCallOut(BaseModel):
    name: str
    arguments: str  # a JSON document as a string, as OpenAI sends it


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallOut


class ToolCallDelta(BaseModel):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionCallOut | None = None


class TopLogprobOut(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprobOut(TopLogprobOut):
    top_logprobs: list[TopLogprobOut]


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprobOut] | None
    refusal: None = None


class ChatMessageOut(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    refusal: None = None
    tool_calls: list[ToolCallOut] | None = None


class ChatChoice(BaseModel):
    index: int
    message: ChatMessageOut
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str | None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    system_fingerprint: str
    choices: list[ChatChoice]
    usage: UsageOut


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChatDelta
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    system_fingerprint: str
    choices: list[ChatChunkChoice]
    usage: UsageOut | None = None


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float | None]  # None for an echoed prompt's first token (nothing precedes it)
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    system_fingerprint: str
    choices: list[CompletionChoice]
    usage: UsageOut | None = None


# ---- Anthropic messages -------------------------------------------------------------------------
class ContentBlockIn(BaseModel):
    """Any input block; which fields matter depends on `type` (text, tool_use, tool_result, ...)."""

    model_config = _LENIENT
    type: str
    text: str | None = None
    id: str | None = None
    name: str | None = None
    input: dict[str, Any] | None = None
    tool_use_id: str | None = None
    content: str | list[dict[str, Any]] | None = None
    is_error: bool | None = None


class AnthropicMessage(BaseModel):
    model_config = _LENIENT
    role: Literal["user", "assistant"]
    content: str | list[ContentBlockIn]


class AnthropicTool(BaseModel):
    model_config = _LENIENT
    name: str = Field(min_length=1, max_length=128)
    description: str | None = None
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})


class JsonOutputFormat(BaseModel):
    model_config = _LENIENT
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(BaseModel):
    model_config = _LENIENT
    format: JsonOutputFormat | None = None
    effort: str | None = None  # a reasoning-effort hint: this model does not reason, so nothing to spend


class MessagesPrompt(BaseModel):
    """What makes the prompt of a /v1/messages call: all that /v1/messages/count_tokens takes."""

    model_config = _LENIENT
    model: str
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: str | list[ContentBlockIn] | None = None
    tools: list[AnthropicTool] | None = None
    tool_choice: dict[str, Any] | None = None
    # structured outputs: output_config.format, or the beta's older top-level output_format
    output_config: OutputConfig | None = None
    output_format: JsonOutputFormat | None = None
    speed: Literal["standard", "fast"] | None = None

    @property
    def output_schema(self) -> dict[str, Any] | None:
        fmt = (self.output_config.format if self.output_config else None) or self.output_format
        return fmt.schema_ if fmt is not None else None


class MessagesRequest(MessagesPrompt):
    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = None
    temperature: float = Field(1.0, ge=0.0, le=1.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    stream: bool = False
    metadata: dict[str, Any] | None = None


class AnthropicUsage(BaseModel):
    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0
    speed: Literal["standard", "fast"] = "standard"

    @classmethod
    def of(cls, u: Usage, tier: str = "standard") -> AnthropicUsage:
        # Anthropic counts cached prompt tokens apart from input_tokens; OpenAI counts them inside.
        return cls(input_tokens=u.prompt_tokens - u.cached_tokens, output_tokens=u.completion_tokens,
                   cache_read_input_tokens=u.cached_tokens, cache_creation_input_tokens=0,
                   speed="fast" if tier == "fast" else "standard")


class MessageOut(BaseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[dict[str, Any]]
    stop_reason: str | None
    stop_sequence: str | None = None
    usage: AnthropicUsage
