"""The command's import shortcuts change nothing outside the command's own process."""

import os

import pytest

from opsbook.core.optional_imports import PYDANTIC_PLUGINS_ENV, without_pydantic_plugins


def test_pydantic_plugins_are_skipped_inside_and_the_environment_is_restored(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(PYDANTIC_PLUGINS_ENV, raising=False)
    with without_pydantic_plugins():
        assert os.environ[PYDANTIC_PLUGINS_ENV] == "__all__"
    assert PYDANTIC_PLUGINS_ENV not in os.environ


def test_an_operator_s_own_plugin_setting_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PYDANTIC_PLUGINS_ENV, "logfire")
    with without_pydantic_plugins():
        assert os.environ[PYDANTIC_PLUGINS_ENV] == "logfire"
    assert os.environ[PYDANTIC_PLUGINS_ENV] == "logfire"
