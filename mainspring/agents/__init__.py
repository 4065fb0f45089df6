"""Durable runtime for long-running agents: journaled steps, leases, tools, approvals, audit, budgets."""
