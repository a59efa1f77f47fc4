"""Where the ``tuner`` client commands find the server and the token.

Each value comes from the first of: the flag (``--server``, ``--token``), the environment (``TUNER_SERVER``,
``TUNER_TOKEN``; ``tuner space`` already read ``TUNER_TOKEN``), the config file, the default
(``http://127.0.0.1:8000``, where ``tuner serve`` listens; no token). The config file is TOML::

    server = "https://tuner.internal"
    token = "tt_..."

at ``$TUNER_CLIENT_CONFIG``, else ``$XDG_CONFIG_HOME/spec-tuner/client.toml`` (``~/.config/...``). A file holding
a token that others can read is still used, with a warning: the token is a bearer secret.
"""

from __future__ import annotations

import os
import stat
import sys
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tuner.client import ClientError

DEFAULT_SERVER = "http://127.0.0.1:8000"
SERVER_ENV = "TUNER_SERVER"
TOKEN_ENV = "TUNER_TOKEN"
CONFIG_ENV = "TUNER_CLIENT_CONFIG"


class ConfigError(ClientError):
    """The config file is there but unreadable or not the TOML it should be."""


@dataclass(frozen=True)
class ClientConfig:
    server: str
    token: str | None
    source: str  # where the server URL came from, for error messages: flag, $TUNER_SERVER, a path, default


def config_path(env: Mapping[str, str] = os.environ) -> Path:
    if env.get(CONFIG_ENV):
        return Path(env[CONFIG_ENV]).expanduser()
    base = Path(env["XDG_CONFIG_HOME"]) if env.get("XDG_CONFIG_HOME") else Path.home() / ".config"
    return base / "spec-tuner" / "client.toml"


def read_config_file(path: Path) -> dict[str, str]:
    """The file's ``server`` and ``token``; an absent file is empty."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror or exc}") from None
    try:
        doc = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    unknown = sorted(set(doc) - {"server", "token"})
    if unknown:
        raise ConfigError(f"{path}: unknown keys {unknown} (it takes server and token)")
    bad = [k for k in ("server", "token") if k in doc and not isinstance(doc[k], str)]
    if bad:
        raise ConfigError(f"{path}: {', '.join(bad)} must be a string")
    if "token" in doc and path.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        print(f"warning: {path} holds a token and others can read it (chmod 600 {path})", file=sys.stderr)
    return {k: doc[k] for k in ("server", "token") if k in doc}


def resolve(server: str | None, token: str | None, env: Mapping[str, str] = os.environ) -> ClientConfig:
    """Flag, then environment, then the config file, then the default; each value on its own."""
    path = config_path(env)
    needs_file = server is None and not env.get(SERVER_ENV) or token is None and not env.get(TOKEN_ENV)
    file = read_config_file(path) if needs_file else {}
    if server is not None:
        url, source = server, "--server"
    elif env.get(SERVER_ENV):
        url, source = env[SERVER_ENV], f"${SERVER_ENV}"
    elif "server" in file:
        url, source = file["server"], str(path)
    else:
        url, source = DEFAULT_SERVER, "the default"
    chosen = token if token is not None else env.get(TOKEN_ENV) or file.get("token")
    return ClientConfig(url.rstrip("/"), chosen or None, source)
