"""The whole database schema: every table module imported once, onto the one `Base.metadata`.

Tables live with the layer that owns them (store/tables.py, agents/tables.py) and import only the declarative
base (store/base.py), so no layer imports another's tables for registration's sake. This module sits outside
the layers, like cli.py: it is the one place that gathers them all, for Alembic (store/migrations/env.py) and
for checks that compare the models with the migrations. A new table module is added here.
"""

from __future__ import annotations

from mainspring.agents import tables as agent_tables
from mainspring.agents.plans import schedule_tables
from mainspring.agents.plans import tables as plan_tables
from mainspring.store import tables as store_tables
from mainspring.store.base import Base

TABLE_MODULES = (store_tables, agent_tables, plan_tables, schedule_tables)
metadata = Base.metadata

__all__ = ["Base", "TABLE_MODULES", "metadata"]
