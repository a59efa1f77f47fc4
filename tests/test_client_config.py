"""Where the client commands find the server and token: flag, then environment, then the config file."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.client_config import DEFAULT_SERVER, ConfigError, config_path, resolve


def test_flag_then_environment_then_file_then_default(tmp_path: Path) -> None:
    config = tmp_path / "client.toml"
    config.write_text('server = "https://file.example/"\ntoken = "from-file"\n')
    config.chmod(0o600)
    env = {"TUNER_CLIENT_CONFIG": str(config)}
    assert resolve(None, None, env).server == "https://file.example"  # without the trailing slash
    assert resolve(None, None, env).token == "from-file" and resolve(None, None, env).source == str(config)
    with_env = env | {"TUNER_SERVER": "http://env:1", "TUNER_TOKEN": "from-env"}
    assert (resolve(None, None, with_env).server, resolve(None, None, with_env).token) == ("http://env:1", "from-env")
    flagged = resolve("http://flag:2", "from-flag", with_env)
    assert (flagged.server, flagged.token, flagged.source) == ("http://flag:2", "from-flag", "--server")
    # each value on its own: a token from the environment, the server from the file
    mixed = resolve(None, None, env | {"TUNER_TOKEN": "from-env"})
    assert (mixed.server, mixed.token) == ("https://file.example", "from-env")
    nothing = resolve(None, None, {"TUNER_CLIENT_CONFIG": str(tmp_path / "absent.toml")})
    assert (nothing.server, nothing.token, nothing.source) == (DEFAULT_SERVER, None, "the default")


def test_the_default_path_follows_xdg() -> None:
    assert config_path({"XDG_CONFIG_HOME": "/cfg"}) == Path("/cfg/spec-tuner/client.toml")
    assert config_path({"TUNER_CLIENT_CONFIG": "/x.toml", "XDG_CONFIG_HOME": "/cfg"}) == Path("/x.toml")


def test_a_bad_file_is_a_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "client.toml"
    env = {"TUNER_CLIENT_CONFIG": str(config)}
    config.write_text("server = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        resolve(None, None, env)
    config.write_text('sever = "typo"\n')
    with pytest.raises(ConfigError, match=r"unknown keys \['sever'\]"):
        resolve(None, None, env)
    config.write_text('token = "t"\n')
    config.chmod(0o644)
    assert resolve(None, None, env).token == "t"
    assert "others can read it" in capsys.readouterr().err
