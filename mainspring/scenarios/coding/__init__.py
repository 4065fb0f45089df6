"""The coding scenario: a repository map as the prompt's cached prefix (repo_map.py), tools that view, search,
edit and test a working copy in the sandbox (tools.py, pytest_run.py), the agent run that loops until the tests
are green (recipe.py) and `mainspring code` (cli.py); the hidden-test harness and the minibench beside them."""
