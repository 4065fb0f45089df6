import pytest

from mainspring.agents.tools.decorator import tool
from mainspring.agents.tools.registry import ToolRegistry, UnknownToolError, builtin_registry


@tool
def echo(text: str) -> str:
    """Say it back."""
    return text


def test_register_get_and_openai_schemas():
    registry = ToolRegistry([echo])
    assert registry.get("echo") is echo and "echo" in registry and len(registry) == 1
    assert registry.schemas() == [{"type": "function", "function": {
        "name": "echo", "description": "Say it back.",
        "parameters": {"type": "object", "additionalProperties": False,
                       "properties": {"text": {"type": "string"}}, "required": ["text"]}}}]


def test_names_are_unique():
    registry = ToolRegistry([echo])
    with pytest.raises(ValueError, match="a tool named 'echo' is already registered"):
        registry.register(tool(name="echo")(lambda text: text))


def test_unknown_names_list_the_known_ones():
    registry = ToolRegistry([echo, tool(name="add")(lambda a, b: a + b)])
    with pytest.raises(UnknownToolError) as info:
        registry.get("ehco")
    assert isinstance(info.value, KeyError)
    assert str(info.value) == "unknown tool 'ehco'; known tools: add, echo"


def test_plain_functions_are_wrapped_and_non_tools_refused():
    registry = ToolRegistry()

    def shout(text: str) -> str:
        return text.upper()

    assert registry.register(shout).name == "shout"
    with pytest.raises(TypeError, match="not a tool"):
        registry.register(42)  # type: ignore[arg-type]


FINANCE = ["list_filings", "get_fact", "search_filings", "read_filing", "compute", "verify_report",
           "verify_research_report"]  # all read-only or keyed by idempotency key in the run's workspace


def test_builtin_registry_has_http_fetch_only_when_enabled(settings):
    # the built-in tools, then each entry-point tool pack by name: coding, finance, scene3d
    assert builtin_registry(settings).names() == ["python", "shell", "search", "sql", "files", "view_file",
                                                  "search_code", "edit_file", "create_file", "run_tests",
                                                  *FINANCE, "scene_validate", "scene_render"]
    enabled = builtin_registry(settings, enable_http=True)
    assert enabled.names()[-1] == "http_fetch"
    flags = {t.name: (t.idempotent, t.requires_approval) for t in enabled}
    assert flags == {"python": (False, False), "shell": (False, False), "search": (True, False),
                     "sql": (True, False), "files": (False, False), "view_file": (True, False),
                     # the coding tools that change files keep each call's first result by idempotency key
                     "search_code": (True, False), "edit_file": (True, False), "create_file": (True, False),
                     "run_tests": (True, False), **{name: (True, False) for name in FINANCE},
                     "scene_validate": (True, False),
                     "scene_render": (True, False), "http_fetch": (True, False)}
    assert enabled.get("python").timeout_s == 30 + 30  # the python profile's wall time plus the margin
