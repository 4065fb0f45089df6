"""Multi-domain RL post-training: domains and rewards, GRPO on our own engine, evaluation, export."""
