"""TEST-ONLY server for the crash test: the real app, database and agent runtime, with a scripted policy model
and slow side-effecting tools, so kill -9 can land in the middle of a call.

    python -m tests.agents.crash_server LEDGER_DIR PORT
"""

import sys
from pathlib import Path

import uvicorn

from mainspring.api.app import create_app
from mainspring.config import Settings
from tests.agents.conftest import CountTool, PolicyModel


def main() -> None:
    ledgers, port = Path(sys.argv[1]), int(sys.argv[2])
    models = {"policy": PolicyModel(tool="count", calls=3), "policy-charge": PolicyModel(tool="charge", calls=1)}
    tools = {
        "count": CountTool(ledgers / "count", delay_s=0.3, delay_after_s=0.3),  # idempotent: keyed effects
        "charge": CountTool(ledgers / "charge", name="charge", idempotent=False, delay_s=2.0),
    }
    app = create_app(Settings(), agent_models=lambda name, project=None: models[name], agent_tools=tools)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main()
