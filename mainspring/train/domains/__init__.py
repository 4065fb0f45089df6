"""Training domains: the registry of shipped and user domains (see base.py for the contract)."""
