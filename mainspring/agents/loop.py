"""The run loop: model step → tool calls → results → … until a final answer, a limit, or a human is needed.

Every step is journaled before its side effects and the loop always restarts from the journal, so the same code
serves a fresh run, a resumed one and one recovered after kill -9. A completed step never runs again; a tool call
cut off mid-flight is re-run only if its tool is idempotent (same idempotency key), otherwise a human decides.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import logging
from concurrent.futures import Executor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Mapping

from mainspring.agents import charges, journal, output, writes
from mainspring.agents.context import CHARS_PER_TOKEN, Prompt, build_prompt, needs_compaction, summarize
from mainspring.agents.journal import LeaseLost, RunState
from mainspring.agents.status import MODEL_STOPPED, RunStatus, ToolCallStatus
from mainspring.agents.attachments import AttachmentPolicy, AttachmentRefused
from mainspring.agents.tools.base import (EndRun, Tool, ToolContext, ToolError, ToolResult, TransientToolError,
                                          openai_schema)
from mainspring.models import ChatModel, Completion, ModelStopped, Usage
from mainspring.retry import backoff_delay

log = logging.getLogger("mainspring.agents")
WRAP_UP = "The step limit is reached. Give your final answer now, without calling any tool."


# (model name, the run's project) -> ChatModel: what the server (api/agent_models.py) or a test lets runs use
ModelResolver = Callable[[str, int | None], ChatModel]


class ModelFailed(Exception):
    pass


@dataclass
class LoopEnv:
    """What every run loop of a worker shares."""
    db: str
    owner: str
    models: ModelResolver
    tools: Mapping[str, Tool]
    data_dir: Path
    price: Callable[[str, Usage], int]  # (model, usage) -> micro-USD
    sandbox: Any = None
    sleep: Callable[[float], Any] = asyncio.sleep
    executor: Executor | None = None  # the worker's journal thread(s); None: the event loop's default pool
    committer: writes.Committer | None = None  # group commit of the loops' batches; None: one by one
    attachments: AttachmentPolicy | None = None  # None: attachments are not re-checked (tests' own worlds)
    meter: Any = None  # billing.metering.Meter: model calls on the run's key's ledger (charges.py); None: not

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> asyncio.Future:
        """Journal calls are blocking SQL: keep them off the event loop."""
        return asyncio.get_running_loop().run_in_executor(self.executor, functools.partial(fn, *args, **kwargs))


@dataclass
class RunLoop:
    env: LoopEnv
    run_id: str
    stop: str | None = None  # set by the worker before it cancels us: cancel | pause | lost | shutdown
    pause_at_boundary: bool = False  # a pause that lets the step in flight finish
    current_call: Any = None  # the ToolCallRow running now
    cancel_event: Any = field(default=None)
    state: RunState | None = None
    # writes queued for the next commit (writes.py); it only holds writes between two awaits, see _commit
    batch: writes.Batch = field(init=False, repr=False)  # set by drive()
    committing: asyncio.Future | None = None
    ending: EndRun | None = None  # a tool ended the run (a handoff): finished after its call is recorded

    async def drive(self) -> None:
        import threading

        self.cancel_event = threading.Event()
        self.batch = writes.Batch(self.run_id)
        try:
            await self._advance()
            await self._commit()  # nothing should be left; never drop a queued write if something is
        except LeaseLost:
            log.info("run %s: lease lost, another worker has it", self.run_id)
        except ModelStopped as exc:  # no step failed: the run waits, whole, for a worker whose model serves
            log.warning("run %s parked: %s", self.run_id, exc)
            try:
                await self._settled()
                self.batch = writes.Batch(self.run_id)
                await self._park(MODEL_STOPPED)
            except LeaseLost:
                pass
        except asyncio.CancelledError:
            await asyncio.shield(self._stopped())
            if self.stop == "shutdown":
                raise
        except Exception as exc:  # a bug or an unrecoverable failure: fail the run, keep the worker alive
            log.exception("run %s failed", self.run_id)
            try:
                await self._settled()
                self.batch = writes.Batch(self.run_id)  # what the failure left queued was never acted on
                await self._finish(RunStatus.FAILED, error=f"{type(exc).__name__}: {exc}", stop_reason="error")
            except LeaseLost:
                pass

    # ---- journal writes ----------------------------------------------------------------------------------
    async def _commit(self) -> None:
        """Commit the queued writes. The loop acts (calls the model, runs a tool, sleeps) only after this, so
        whatever it acts on is durable first, and a cancel can only land here or where nothing is queued."""
        if not self.batch:
            return
        batch, self.batch = self.batch, writes.Batch(self.run_id)
        committer = self.env.committer
        self.committing = committer.submit(batch) if committer else self.env.call(writes.commit, self.env.db,
                                                                                   self.env.owner, batch)
        # shielded: a cancel must not drop a commit still queued for the journal thread; _stopped waits for it
        await asyncio.shield(self.committing)

    async def _settled(self) -> None:
        """Wait for a commit that a cancel or an error cut us off from (its outcome is the journal's)."""
        if self.committing is not None and not self.committing.done():
            await asyncio.wait([self.committing])

    async def _write(self, fn, *args, **kwargs):
        """A blocking journal call outside the batch (reading the run back), after the queue."""
        await self._commit()
        return await self.env.call(fn, *args, **kwargs)

    async def _finish(self, status: RunStatus, **how: Any) -> None:
        """End the run, after what is queued. Its counters (in the audit entry) are read back: after a failure
        the loop's copy may count writes that were never committed."""
        run = await self._write(self._fresh_run)
        journal.finish_run(self.batch, run, status, **how)
        await self._commit()

    async def _park(self, reason: str) -> None:
        journal.park_run(self.batch, reason)
        await self._commit()

    async def _stopped(self) -> None:
        self.cancel_event.set()
        try:
            await self._settled()
            if self.stop == "cancel":
                if self.current_call is not None:
                    journal.finish_call(self.batch, self.current_call, ToolCallStatus.CANCELLED,
                                        {"content": "cancelled", "is_error": True})
                await self._finish(RunStatus.CANCELLED, stop_reason="cancelled")
            elif self.stop == "pause":
                await self._park("user")
        except LeaseLost:
            pass

    async def _advance(self) -> None:
        # The journal is read once per lease; after that the loop applies its own writes to this copy.
        # Others' changes reach a running loop through the worker (cancel, pause, lost lease).
        self.state = state = await self.env.call(journal.load_state, self.env.db, self.run_id)
        run = state.run
        if run.lease_owner != self.env.owner or run.status != RunStatus.RUNNING:
            return
        if run.cancel_requested or run.pause_requested:
            self.stop = "cancel" if run.cancel_requested else "pause"
            await self._stopped()
            return
        while True:
            run = state.run
            if self.pause_at_boundary:
                self.stop = "pause"
                await self._stopped()
                return
            if run.deadline_at and datetime.now(timezone.utc) > run.deadline_at:
                await self._finish(RunStatus.TIMED_OUT, stop_reason="max_wall_s",
                                   error=f"ran past max_wall_s={state.spec.limits.max_wall_s}")
                return
            calls = state.open_calls()
            if calls:
                if not await self._run_calls(state, calls):
                    return  # waiting for a human
                continue
            if not await self._model_step(state):
                return

    # ---- tools -----------------------------------------------------------------------------------------
    async def _run_calls(self, state: RunState, calls) -> bool:
        limits = state.spec.limits
        for call in calls:
            tool = self._allowed_tool(state, call.name)
            if call.status == ToolCallStatus.WAITING_APPROVAL:
                await self._commit()
                return False  # an interrupt is open (a resolve queues the run again)
            needs_human = None
            if call.status == ToolCallStatus.RUNNING and not (tool and tool.idempotent):
                needs_human = "in_flight"  # cut off mid-call; running it again blindly could repeat its effect
            elif call.status == ToolCallStatus.PENDING and tool and tool.requires_approval:
                needs_human = "approval"
            if needs_human:
                journal.open_interrupt(self.batch, call, needs_human, limits.approval_ttl_s,
                                       limits.approval_expiry_decision)
                await self._commit()
                return False
            await self._execute(state, call, tool)
            if self.ending is not None:
                await self._finish(RunStatus.SUCCEEDED, result=self.ending.result, stop_reason=self.ending.stop_reason)
                return False
        return True

    def _allowed_tool(self, state: RunState, name: str) -> Tool | None:
        """Exactly the tools the run's agent lists: a call to any other (known to the server or not) is refused."""
        return self.env.tools.get(name) if name in state.spec.tools else None

    async def _execute(self, state: RunState, call, tool: Tool | None) -> None:
        self.current_call = call
        journal.start_call(self.batch, call, call.arguments_json)
        await self._commit()  # with the previous step's answer or call's result: one transaction, before the effect
        if tool is None:
            listed = ", ".join(sorted(state.spec.tools)) or "none"
            result = ToolResult(f"tool {call.name!r} is not one of this agent's tools (refused, not run); "
                                f"its tools: {listed}", is_error=True)
        else:
            try:
                args = json.loads(call.arguments_json or "{}")
                if not isinstance(args, dict):
                    raise ValueError("arguments must be a JSON object")
            except ValueError as exc:
                result = ToolResult(f"arguments are not a valid JSON object: {exc}", is_error=True)
            else:
                result = await self._call_with_retries(state, call, tool, args)
        artifacts = self._save_artifacts(call.id, result)
        payload = {"content": result.content, "data": result.data, "is_error": result.is_error}
        # queued: committed with the next action's own write, before that action
        journal.finish_call(self.batch, call, ToolCallStatus.FAILED if result.is_error else ToolCallStatus.COMPLETED,
                            payload, artifacts)
        self.current_call = None

    async def _call_with_retries(self, state: RunState, call, tool: Tool, args: dict) -> ToolResult:
        workspace = self.env.data_dir / "runs" / self.run_id / "workspace"
        workspace.mkdir(parents=True, exist_ok=True)
        attachments = json.loads(state.run.attachments_json or "{}")
        if self.env.attachments is not None:  # checked again now: a path may have become a symlink since
            try:
                for kind, path in attachments.items():
                    self.env.attachments.check_path(kind, path, stored=True)
            except AttachmentRefused as exc:
                return ToolResult(f"{exc} (refused, not run)", is_error=True)
        ctx = ToolContext(run_id=self.run_id, call_id=call.id, idempotency_key=call.idempotency_key,
                          workspace=workspace, attachments=attachments,
                          cancel=self.cancel_event, sandbox=self.env.sandbox, goal=state.run.goal)
        delay = state.spec.limits.retry_backoff_s
        for attempt in range(tool.retries + 1):
            try:
                async with asyncio.timeout(tool.timeout_s):  # wait_for would lose a cancel that meets the result
                    return await tool.call(args, ctx)
            except (TimeoutError, TransientToolError) as exc:
                reason = f"timed out after {tool.timeout_s:g}s" if isinstance(exc, TimeoutError) else str(exc)
                if attempt == tool.retries:
                    return ToolResult(f"{call.name} failed: {reason}", is_error=True)
                await self.env.sleep(backoff_delay(attempt, delay, 60))
            except ToolError as exc:
                return ToolResult(str(exc), is_error=True)
            except EndRun as end:
                self.ending = end
                return ToolResult(end.content, data={"stop_reason": end.stop_reason})
        raise AssertionError("unreachable")

    def _save_artifacts(self, call_id: str, result: ToolResult) -> list[dict]:
        saved = []
        for artifact in result.artifacts:
            rel = Path("runs") / self.run_id / "artifacts" / f"{call_id}-{Path(artifact.name).name}"
            (self.env.data_dir / rel).parent.mkdir(parents=True, exist_ok=True)
            (self.env.data_dir / rel).write_bytes(artifact.data)
            saved.append({"name": artifact.name, "mime": artifact.mime, "bytes": len(artifact.data),
                          "sha256": hashlib.sha256(artifact.data).hexdigest(), "path": str(rel)})
        return saved

    # ---- model -----------------------------------------------------------------------------------------
    async def _model_step(self, state: RunState) -> bool:
        env, limits, run = self.env, state.spec.limits, state.run
        prompt = build_prompt(state)
        if needs_compaction(state, prompt):
            summary, through = summarize(state)
            state.steps.append(journal.record_compaction(self.batch, state.next_seq, summary, through))
            await self._commit()
            return True  # rebuild the messages with the summary in place
        schema = output.schema_of(state)
        refused = output.refused_answer(state)  # why the schema refused the last answer: this is the finalize step
        finalizing = refused is not None
        wrap_up = not finalizing and run.step_count >= limits.max_steps - 1
        tools = [] if wrap_up or finalizing else [openai_schema(env.tools[n]) for n in state.spec.tools
                                                  if n in env.tools]
        if refused is not None:
            prompt = prompt.plus(output.finalize_message(state, refused))
        elif wrap_up:
            prompt = prompt.plus({"role": "user", "content": WRAP_UP})
        # a call that offers no tools can only answer: constrained to the schema from the first such call
        response_format = output.response_format(schema) if schema is not None and not tools else None
        if self._over_budget(state, prompt):
            state.run = await self._write(self._fresh_run)  # the budget may have been raised meanwhile
            if self._over_budget(state, prompt):
                await self._park("budget")
                return False
        step = journal.begin_step(self.batch, state, state.next_seq if state.open_step is None else
                                 state.open_step.seq, "model", prompt.input_hash(tools))
        if refused is not None and step.attempts == 1:  # a retry after a crash has noted it already
            output.note_finalize(self.batch, state, refused)
        await self._commit()  # with the last call's result: one transaction, before the model is called
        try:
            completion, charged_u = await self._chat(state, step.id, prompt.messages, tools, prompt.tokens(),
                                                     response_format)
        except charges.KeyBudgetExceeded as exc:  # the key's or project's budget: paused as by the run's own
            charges.note_refusal(self.batch, exc)
            await self._park("budget")
            return False
        except charges.KeyRevoked as exc:
            await self._finish(RunStatus.FAILED, error=str(exc), stop_reason="key_revoked")
            return False
        except ModelFailed as exc:
            await self._finish(RunStatus.FAILED, error=str(exc), stop_reason="model_error")
            return False
        message = completion.to_message()
        if wrap_up or finalizing:  # offered no tools: whatever it calls, this answer ends the run
            message.pop("tool_calls", None)
        # the agent's name for its model when the sheet prices it ("default" is not), else the one that answered
        cost = charged_u if charged_u is not None else (
            env.price(state.spec.model, completion.usage) or env.price(completion.model, completion.usage))
        # queued: committed with the first call's start (or the ending, or the finalize step), before either happens
        calls = journal.complete_model_step(self.batch, state, step, message, completion.usage, cost,
                                            set(state.spec.tools) & set(env.tools))
        if not calls:
            ending = output.ending(state, completion.text, wrap_up, finalizing)
            if ending is None:
                return True  # refused: queued, committed with the finalize step's start (output.refused_answer)
            status, how = ending
            journal.finish_run(self.batch, state.run, status, **how)
            await self._commit()
            return False
        return True

    def _over_budget(self, state: RunState, prompt: Prompt) -> bool:
        run, limits = state.run, state.spec.limits
        estimate = Usage(prompt_tokens=prompt.tokens(), cached_tokens=0, completion_tokens=limits.max_tokens)
        used = run.prompt_tokens + run.completion_tokens
        if run.token_budget is not None and used + estimate.total_tokens > run.token_budget:
            return True
        model = self.env.models(state.spec.model, state.run.project_id)
        served_as = getattr(model, "model", None) or state.spec.model
        estimate_u = self.env.price(state.spec.model, estimate) or self.env.price(served_as, estimate)
        if run.cost_budget_u is not None and run.cost_u + estimate_u > run.cost_budget_u:
            return True
        return False

    async def _chat(self, state: RunState, step_id: str, messages: list[dict], tools: list[dict],
                    prompt_tokens: int, response_format: dict | None = None) -> tuple[Completion, int | None]:
        """The model's answer, and its cost when it was charged to the run's key's ledger (charges.py): the
        call's worst case is held against the key's and project's budgets first (KeyBudgetExceeded if they cannot
        cover it), and settled to its cost after; a call that ends without an answer releases its hold."""
        env, limits = self.env, state.spec.limits
        model = env.models(state.spec.model, state.run.project_id)
        charge = None
        if env.meter is not None:
            served_as = getattr(model, "model", None)
            input_tokens = prompt_tokens + (len(json.dumps(tools)) // CHARS_PER_TOKEN if tools else 0)
            charge = await env.call(charges.reserve, env.meter, state.run, step_id,
                                    (state.spec.model, served_as), input_tokens, limits.max_tokens)
        try:
            completion = await self._ask(state, model, messages, tools, response_format)
        except BaseException:
            if charge is not None:  # shielded: a cancel (pause, shutdown) must not leave the hold behind
                try:
                    await asyncio.shield(env.call(charges.release, charge))
                except Exception:  # the hold then expires on its own; the call's own error is the one to report
                    log.exception("run %s: could not release the budget hold of step %s", self.run_id, charge.step_id)
            raise
        if charge is None:
            return completion, None
        # priced as the step's cost is without a meter: the agent's name for its model, else the one that answered
        return completion, await env.call(charges.settle, charge, (state.spec.model, completion.model), completion)

    async def _ask(self, state: RunState, model: ChatModel, messages: list[dict], tools: list[dict],
                   response_format: dict | None = None) -> Completion:
        from mainspring.models import UpstreamError

        limits = state.spec.limits
        last = ""
        for attempt in range(limits.model_retries + 1):
            try:
                async with asyncio.timeout(limits.step_timeout_s):
                    return await model.chat(
                        messages, tools=tools or None, response_format=response_format,
                        tool_choice="required" if tools and state.spec.tool_choice == "required" else None,
                        max_tokens=limits.max_tokens, temperature=state.spec.temperature)
            except TimeoutError:
                last = f"model call timed out after {limits.step_timeout_s:g}s"
            except ModelStopped:
                raise
            except UpstreamError as exc:
                if exc.status is not None and exc.status < 500 and exc.status != 429:
                    raise ModelFailed(str(exc)) from exc
                last = str(exc)
            except (ConnectionError, OSError) as exc:
                last = f"{type(exc).__name__}: {exc}"
            if attempt < limits.model_retries:
                self.batch.event("step.retry", attempt=attempt + 1, error=last)
                await self._commit()
                await self.env.sleep(backoff_delay(attempt, limits.retry_backoff_s, 60))
        raise ModelFailed(f"model failed after {limits.model_retries + 1} attempts: {last}")

    def _fresh_run(self):
        from mainspring.store.db import session

        with session(self.env.db, readonly=True) as s:
            return journal.get_run(s, self.run_id)
