"""AgentSpec: what an agent is (model, instructions, tools, limits). Stored frozen per version; runs pin one."""

from __future__ import annotations

from typing import Any, Literal, Optional

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from pydantic import BaseModel, ConfigDict, Field, field_validator

DEFAULT_INSTRUCTIONS = (
    "You are a careful agent. Work towards the user's goal step by step. Call a tool when you need "
    "information or an action; when the goal is met, answer with the final result and call no tool."
)
TEN_YEARS_S = 10 * 365 * 24 * 3600  # bounds keep datetime arithmetic (deadlines, expiries) in range


class AgentLimits(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_steps: int = Field(50, ge=1, description="model steps; at the limit the agent is asked for a final answer")
    max_wall_s: float = Field(24 * 3600, gt=0, le=TEN_YEARS_S, description="from the run's start; then timed_out")
    step_timeout_s: float = Field(300, gt=0, le=24 * 3600, description="one model call")
    model_retries: int = Field(3, ge=0, description="retries of transient model failures (5xx, 429, timeouts)")
    retry_backoff_s: float = Field(1.0, ge=0, description="first retry delay; doubles, capped at 60 s")
    max_tokens: int = Field(512, ge=1, description="per model call")
    token_budget: Optional[int] = Field(None, ge=1, description="prompt + completion tokens; pauses the run")
    cost_budget_usd: Optional[str] = Field(None, description="list-price USD, e.g. '0.50'; pauses the run")
    context_tokens: int = Field(6000, ge=256, description="past this estimate, old steps are compacted")
    keep_recent_steps: int = Field(4, ge=1, description="steps kept verbatim when compacting")
    approval_ttl_s: Optional[float] = Field(7 * 24 * 3600, gt=0, le=TEN_YEARS_S,
                                            description="pending approvals expire after this")
    approval_expiry_decision: Literal["reject", "approve"] = "reject"


class AgentSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(..., min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.-]+$")
    model: str = "smollm2"
    instructions: str = DEFAULT_INSTRUCTIONS
    tools: list[str] = Field(default_factory=list)
    temperature: float = Field(0.0, ge=0, le=2)
    tool_choice: Literal["auto", "required"] = Field(
        "auto", description="required: every step offered tools must call one, so the run ends only when a tool "
        "ends it (or at max_steps' wrap-up); for agents whose every step is a tool's work, such as a verifier")
    limits: AgentLimits = Field(default_factory=AgentLimits)
    output_schema: dict[str, Any] | None = Field(
        None, description="a JSON Schema (2020-12) the final answer must meet; the run's result is then its "
                          "canonical JSON (agents/output.py)")

    @field_validator("output_schema")
    @classmethod
    def _is_json_schema(cls, schema: dict[str, Any] | None) -> dict[str, Any] | None:
        # checked when the agent is put, not when its first run ends: a 400 at once instead of failed runs later
        if schema is not None:
            try:
                Draft202012Validator.check_schema(schema)
            except SchemaError as exc:
                where = "".join(f"/{p}" for p in exc.absolute_path) or "/"
                raise ValueError(f"not a valid JSON Schema: {exc.message} (at {where})") from None
        return schema
