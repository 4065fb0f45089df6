"""Settings: the one reader of MAINSPRING_* variables."""

import pytest
from pydantic import ValidationError

from mainspring.config import Settings


def test_defaults_and_env(monkeypatch, tmp_path):
    monkeypatch.setenv("MAINSPRING_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("MAINSPRING_KV_CACHE_MB", "64")
    monkeypatch.setenv("MAINSPRING_ENABLE_PREFIX_CACHING", "false")
    s = Settings()
    assert s.data_dir == tmp_path and s.cache_dir == tmp_path / "cache"
    assert s.kv_cache_mb == 64 and s.enable_prefix_caching is False
    assert s.model == "smollm2" and s.host == "127.0.0.1"
    assert s.resolved_threads() >= 1


def test_bad_values_name_the_variable(monkeypatch):
    monkeypatch.setenv("MAINSPRING_PORT", "not-a-port")
    with pytest.raises(ValidationError, match="port"):
        Settings()
