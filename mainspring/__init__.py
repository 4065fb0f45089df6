"""Mainspring: a self-hosted platform for long-context inference, agents and RL post-training."""

__version__ = "0.1.0"
