"""Scenario packs: agent recipes, data sets and evaluations per domain (scene3d, ...)."""
