"""Which host configuration file is read: host.config.resolve_path, the one rule of load, host.volumes.config_path
and the inventory plugin's host source (option, else $ZJUSCT_CLOUD_CONFIG, else the default path)."""

from __future__ import annotations

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.host import config as hostconfig
from ansible_collections.zjusct.cloud.plugins.module_utils.host.volumes import config_path


def test_the_option_wins_then_the_environment_then_the_default(monkeypatch, tmp_path):
    monkeypatch.delenv(hostconfig.PATH_ENV, raising=False)
    assert hostconfig.resolve_path(None) == (hostconfig.DEFAULT_PATH, False)
    assert hostconfig.resolve_path("") == (hostconfig.DEFAULT_PATH, False)
    monkeypatch.setenv(hostconfig.PATH_ENV, str(tmp_path / "env.json"))
    assert hostconfig.resolve_path(None) == (str(tmp_path / "env.json"), True)
    assert hostconfig.resolve_path("opt.json") == ("opt.json", True)


def test_load_and_config_path_follow_the_rule(monkeypatch, tmp_path):
    named = tmp_path / "host.json"
    monkeypatch.setenv(hostconfig.PATH_ENV, str(named))
    with pytest.raises(FileNotFoundError, match=r"^host_config: .*host\.json does not exist"):
        hostconfig.load(None)
    assert config_path(None) is None, "no file: the defaults, no path to hand on"
    named.write_text('{"subnet": "10.201.0.0/24"}')
    assert hostconfig.load(None).subnet == "10.201.0.0/24"
    assert config_path(None) == str(named)
    other = tmp_path / "other.json"
    other.write_text("{}")
    assert config_path(str(other)) == str(other), "the option wins over the environment"
