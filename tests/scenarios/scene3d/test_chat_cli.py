"""`mainspring scene chat` on a scripted model: the check table and the preview PNG each turn,
turns from stdin without a TTY, a narrow terminal, and exit code 2 for unusable input."""

from __future__ import annotations

import json

import pytest
import typer
from PIL import Image
from typer.testing import CliRunner

from mainspring.scenarios.scene3d import chat_cli
from mainspring.scenarios.scene3d.chat_cli import chat_cmd
from mainspring.scenes.patch import dumps
from tests.scenarios.scene3d.scripted import ScriptedModel
from tests.scenarios.scene3d.test_dialogue import CUP_BACK_ON_TOP, TALLER
from tests.scenarios.scene3d.test_refine import written

app = typer.Typer()
app.callback()(lambda: None)  # keep `chat` a subcommand, as under `mainspring scene`
app.command("chat")(chat_cmd)
runner = CliRunner()


@pytest.fixture
def scripted(monkeypatch):
    def use(answers):
        model = ScriptedModel(answers)
        closed = []
        monkeypatch.setattr(chat_cli, "open_model", lambda: (model, lambda: closed.append(True)))
        return model, closed
    return use


def test_a_chat_prints_the_check_table_and_writes_a_preview_each_turn(scripted, tmp_path, monkeypatch):
    model, closed = scripted([dumps(written(0.8)), TALLER, CUP_BACK_ON_TOP])
    monkeypatch.setattr(chat_cli.out, "width", 60)  # a narrow terminal wraps, it does not fail
    result = runner.invoke(app, ["chat", "--brief", "cup_on_table", "--out", str(tmp_path), "--json"],
                           input="Make the table taller.\nquit\nnot read\n")
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert "turn 0: pinned constraints" in text and "turn 1: pinned constraints" in text
    assert "the edit broke on_top_of(cup, table)" in text and "repaired" in text
    assert "on_floor(table)" in text and "PASS" in text
    assert len(model.calls) == 3 and closed == [True]  # "quit" ended it; the model was closed
    for n in (0, 1):
        image = Image.open(tmp_path / f"turn-{n}.png")
        assert image.size == (512, 512)
        assert json.loads((tmp_path / f"turn-{n}.json").read_text())["schema"] == "scene/0.1"
    thread = json.loads(text[text.index('{\n "doc"'):])
    assert thread["turns"][1]["broken"] and thread["turns"][1]["repaired"]
    assert len(thread["pinned"]) == 5


def test_turns_can_be_given_as_options_and_rendering_skipped(scripted, tmp_path):
    scripted([dumps(written(0.8)), TALLER, CUP_BACK_ON_TOP])
    result = runner.invoke(app, ["chat", "--request", "A cup on a table.", "--ids", "table,cup", "--out",
                                 str(tmp_path), "--turn", "Make the table taller.", "--no-render"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "turn-1.json").exists() and not list(tmp_path.glob("*.png"))
    assert "0 of 0" not in result.stdout


@pytest.mark.parametrize("args, says", [
    (["--brief", "no_such_brief"], "no brief named 'no_such_brief'"),
    ([], "give --brief NAME"),
    (["--request", "A ball."], "give --brief NAME"),
    (["--request", "A ball.", "--ids", "Ball!"], "--ids must be snake_case"),
    (["--request", "A ball.", "--ids", "a,a"], "1 to 8 distinct ids"),
    (["--brief", "cup_on_table", "--ids", "a"], "not both"),
    (["--brief", "cup_on_table", "--max-rounds", "-1"], "max-rounds"),
])
def test_bad_input_is_a_message_and_exit_code_2(scripted, tmp_path, args, says):
    model, _ = scripted([])
    result = runner.invoke(app, ["chat", "--out", str(tmp_path), *args])
    assert result.exit_code == 2 and says in result.output
    assert model.calls == [] and "Traceback" not in result.output


def test_the_model_is_built_on_the_compute_thread_that_steps_it(monkeypatch):
    """Built on the main thread, the engine would leave that thread a libgomp pool of its own, and each step on
    the compute thread would pay futex wake-ups (mainspring/compute.py)."""
    import mainspring.engine.async_engine as async_engine
    import mainspring.engine.engine as engine_module
    import mainspring.engine.loader as loader
    import mainspring.models.local as local
    from mainspring.compute import compute_thread

    built_on = []

    class Engine:
        def __init__(self, loaded, config):
            built_on.append(compute_thread().on_thread())

    monkeypatch.setattr(loader, "load_model", lambda *args: "loaded")
    monkeypatch.setattr(engine_module, "LLMEngine", Engine)

    class Async:
        def __init__(self, engine):
            self.engine = engine

        def close(self):
            pass

    monkeypatch.setattr(async_engine, "AsyncLLMEngine", Async)
    monkeypatch.setattr(local, "LocalModel", lambda engine: engine)
    model, close = chat_cli.open_model()
    close()
    assert built_on == [True]
