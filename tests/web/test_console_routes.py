"""The console's routes over HTTP (no browser): the page and its files, their headers, and bad paths as 4xx."""

from __future__ import annotations

from typing import Iterator

import pytest

from mainspring.api.routes import console
from tests.api.test_agent_routes import AgentServer, agent_server


@pytest.fixture(scope="module")
def srv(tmp_path_factory) -> Iterator[AgentServer]:
    with agent_server(tmp_path_factory.mktemp("console-routes"), require_auth=True) as s:
        yield s


@pytest.fixture
def fake_three(monkeypatch, tmp_path):
    """A vendored three.js of one file, whether or not npm installed the real one here."""
    (tmp_path / "three" / "build").mkdir(parents=True)
    (tmp_path / "three" / "build" / "three.module.js").write_text("export const REVISION = 'fake';\n")
    (tmp_path / "three" / "package.json").write_text("{}")
    monkeypatch.setattr(console, "VENDOR_DIR", tmp_path)


def not_found(r, code: str = "not_found") -> None:
    assert r.status_code == 404, r.text
    body = r.json()["error"]
    assert set(body) == {"message", "type", "param", "code"} and body["code"] == code


def test_the_page_and_its_modules_need_no_key_and_carry_a_strict_csp(srv):
    r = srv.http.get("/")  # no key even with auth on: the page holds no data, the API asks for the key
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    csp = r.headers["content-security-policy"]
    assert "default-src 'self'" in csp and "'unsafe-inline'" not in csp and "'sha256-" in csp
    js = srv.http.get("/console/app.js")
    assert js.status_code == 200 and js.headers["content-type"].startswith("text/javascript")
    assert srv.http.get("/console/pages/runs.js").status_code == 200
    assert srv.http.get("/v1/runs").status_code == 401  # the data stays behind the key


@pytest.mark.parametrize("path", [
    "/console/nope.js", "/console/%2e%2e/api/app.py", "/console/pages/%00.js", "/console/",
    "/console/vendor/three/package.json", "/console/vendor/left-pad/index.js",
    "/console/vendor/three/build/%2e%2e/package.json", "/console/vendor/three/build/"])
def test_bad_paths_are_404_with_an_error_body(srv, fake_three, path):
    not_found(srv.http.get(path))


def test_a_vendored_file_is_served(srv, fake_three):
    r = srv.http.get("/console/vendor/three/build/three.module.js")
    assert r.status_code == 200 and "fake" in r.text and r.headers["content-type"].startswith("text/javascript")


def test_three_missing_says_so(srv, monkeypatch, tmp_path):
    monkeypatch.setattr(console, "VENDOR_DIR", tmp_path / "absent")
    not_found(srv.http.get("/console/vendor/three/build/three.module.js"), "vendor_not_installed")
