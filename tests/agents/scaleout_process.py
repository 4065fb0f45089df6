"""TEST-ONLY processes for the scale-out kill test: an API server that drives no runs, or a worker with no HTTP,
both on the database in MAINSPRING_DATABASE_URL, with a scripted policy model and a side-effecting tool.

    python -m tests.agents.scaleout_process api LEDGER_DIR PORT
    python -m tests.agents.scaleout_process worker LEDGER_DIR [TOOL_DELAY_S]

bench/scaleout.py (2) runs the same workers with no tool delay, to time the runtime itself.
"""

import asyncio
import sys
from pathlib import Path

from mainspring.config import Settings
from tests.agents.conftest import CountTool, PolicyModel

CALLS = 2


def main() -> None:
    role, ledgers = sys.argv[1], Path(sys.argv[2])
    policy = PolicyModel(tool="count", calls=CALLS)
    policy.model = "SmolLM2-135M-Instruct"  # what it says it is: priced by the built-in sheet, so every call is billed
    models = {"policy": policy}
    delay = float(sys.argv[3]) if role == "worker" and len(sys.argv) > 3 else 0.05
    tools = {"count": CountTool(ledgers / "count", delay_s=delay, delay_after_s=delay)}  # idempotent: keyed effects
    resolver = lambda name, project=None: models[name]  # noqa: E731
    if role == "api":
        import uvicorn

        from mainspring.api.app import create_app

        app = create_app(Settings(serve_agent_worker=False), agent_models=resolver, agent_tools=tools)
        uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[3]), log_level="warning")
    else:
        import logging

        from mainspring.api.worker_process import run_worker

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")  # "driving runs" = up
        asyncio.run(run_worker(Settings(), models=resolver, tools=tools))


if __name__ == "__main__":
    main()
