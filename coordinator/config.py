"""The coordinator's configuration: defaults, then RANKSCOPE_* environment, then flags.

Resolved once into a frozen dataclass and passed explicitly; nothing reads the
environment later.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from rankscope.address import host_port
from rankscope.errors import ConfigError

ENV_PREFIX = "RANKSCOPE_"
# The longest any of the coordinator's durations may be set to: no sweep outlasts a day (its
# timeout's limit), so a longer wait is a typo. Unbounded, a heartbeat interval's milliseconds
# overflowed RegisterReply's int64 (every Register failed) and a ping interval past a thread's
# longest wait (threading.TIMEOUT_MAX, about 292 years) failed every session.
MAX_SECONDS = 86_400.0


@dataclass(frozen=True)
class CoordinatorConfig:
    listen: str = "0.0.0.0:7443"
    data_dir: Path = Path("rankscope-data")
    max_upload_bytes: int = 8 << 30  # one raw nsys report can be several GiB
    chunk_bytes: int = 1 << 20  # suggested to agents; well under gRPC's 4 MiB receive limit
    node_timeout_s: float = 120.0  # beyond the capture duration, for export and upload
    # From a sweep's start to its windows' start on every node: the time nodes take to pause
    # DCGM and make their ranks ready (a first torch window imports for 1 to 2.5 s), so that
    # the nodes begin (and end) their windows together; a node ready later begins when ready.
    window_lead_s: float = 3.0
    restart_grace_s: float = 60.0  # after a restart, agents get this long to come back
    heartbeat_interval_s: float = 10.0
    ping_interval_s: float = 5.0
    # An agent not heard from this long (no heartbeat, pong or status: killed, its node down or
    # cut off) is judged lost: its node fails in the running sweeps, named, rather than hold
    # them until their timeouts. Time enough for a killed agent's restart to come back.
    agent_lost_s: float = 30.0
    # The sync gRPC server holds one worker thread per open stream: every connected agent's
    # session, every upload and every watching user; calls beyond it are refused at once
    # (RESOURCE_EXHAUSTED) rather than queued. Agent sessions may take half (`max_sessions`),
    # so that a fleet's uploads after a capture, and the users' commands, always find a
    # thread. Threads start only as calls need them: a large pool costs nothing idle.
    max_workers: int = 4096
    grace_s: float = 5.0  # how long a stopping server lets RPCs finish
    tls_cert: Path | None = None  # PEM; with tls_key the port speaks TLS
    tls_key: Path | None = None
    tls_client_ca: Path | None = None  # PEM; set, clients must present a certificate it signed (mTLS)
    # Each agent holds its own node's certificate (deployment.md §4: CN = node): it registers
    # only under a name its certificate carries, so a node's stolen key (or a user's) speaks
    # for no other node. Off, one certificate may serve the fleet.
    node_certs: bool = False

    @property
    def max_sessions(self) -> int:
        return max(1, self.max_workers // 2)

    @property
    def state_db(self) -> Path:
        return self.data_dir / "state.sqlite"

    @property
    def artifacts_dir(self) -> Path:
        return self.data_dir / "artifacts"

    @property
    def reports_dir(self) -> Path:
        return self.data_dir / "reports"


def resolve(flags: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None) -> CoordinatorConfig:
    """Defaults, overridden by ``RANKSCOPE_<FIELD>`` variables, overridden by non-None flags."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for field in fields(CoordinatorConfig):
        raw = environ.get(ENV_PREFIX + field.name.upper())
        if raw is not None:
            values[field.name] = _parse(field.name, field.type, raw, f"${ENV_PREFIX}{field.name.upper()}")
    for name, value in (flags or {}).items():
        if value is not None:
            values[name] = _parse(name, _type_of(name), value, f"--{name.replace('_', '-')}")
    config = replace(CoordinatorConfig(), **values)
    _check(config)
    return config


def _type_of(name: str) -> str:
    for field in fields(CoordinatorConfig):
        if field.name == name:
            return str(field.type)
    raise ConfigError(f"unknown coordinator setting {name!r}")


def _parse(name: str, kind: Any, raw: Any, where: str) -> Any:
    kind = str(kind)
    try:
        if kind in ("Path", "Path | None"):
            return Path(raw)
        if kind == "int" and name.endswith("_bytes"):
            return _size(raw)
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
        if kind == "bool":
            return raw if isinstance(raw, bool) else _BOOLS[str(raw).strip().lower()]
        return str(raw)
    except (TypeError, ValueError, KeyError):
        what = ("size: bytes, or with K, M, G or T (1024s), e.g. 8G," if name.endswith("_bytes") else
                "yes/no (1/0, true/false, on/off)" if kind == "bool" else f"valid {kind}")
        raise ConfigError(f"{where}: {raw!r} is not a {what} for {name}") from None


_BOOLS = {word: value for value, words in ((True, ("1", "true", "yes", "on")), (False, ("0", "false", "no", "off", "")))
          for word in words}
# Bytes, or a number of K, M, G or T: powers of 1024, as the help's "8 GiB" (8G, 8GiB, 1.5G).
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(?:([KMGT])(?:i?B)?|B)?\s*", re.IGNORECASE)


def _size(raw: Any) -> int:
    match = _SIZE.fullmatch(str(raw))
    if not match:
        raise ValueError(raw)
    scale = 1 << 10 * ("KMGT".index(match[2].upper()) + 1) if match[2] else 1
    number = match[1]
    return int(number) * scale if "." not in number else int(float(number) * scale)


def _check(config: CoordinatorConfig) -> None:
    if (config.tls_cert is None) != (config.tls_key is None):
        raise ConfigError("TLS needs both a certificate and its private key (--tls-cert and --tls-key)")
    if config.tls_client_ca is not None and config.tls_cert is None:
        raise ConfigError("--tls-client-ca needs the server's own --tls-cert and --tls-key")
    if config.node_certs and config.tls_client_ca is None:
        raise ConfigError("--node-certs needs --tls-client-ca: without client certificates there is no node name to check")
    if host_port(config.listen) is None:
        raise ConfigError(f"listen address {config.listen!r} must be HOST:PORT, the port 0-65535 (0 picks one)")
    if not 0 < config.max_upload_bytes < 1 << 63:  # the wire's int64: beyond, every agent's Register failed
        raise ConfigError(f"--max-upload-bytes must be positive and under 8388608T, got {config.max_upload_bytes}")
    if not 1 << 10 <= config.chunk_bytes <= 3 << 20:
        raise ConfigError(f"chunk_bytes {config.chunk_bytes} must be between 1 KiB and 3 MiB (gRPC's limit is 4 MiB)")
    if config.max_workers < 2:  # agent sessions take at most half, and the rest need one at least
        raise ConfigError(f"max_workers must be at least 2, got {config.max_workers}")
    for name in ("node_timeout_s", "restart_grace_s", "heartbeat_interval_s", "ping_interval_s", "agent_lost_s",
                 "grace_s"):
        if not 0 < getattr(config, name) <= MAX_SECONDS:  # NaN too: float() of the environment takes "nan"
            raise ConfigError(f"{name} must be a positive number of seconds up to {MAX_SECONDS:g}, got "
                              f"{getattr(config, name)}")
    if config.agent_lost_s < 2 * config.heartbeat_interval_s:  # one late heartbeat must not fail a node
        raise ConfigError(f"agent_lost_s ({config.agent_lost_s:g}s) must be at least two heartbeat intervals "
                          f"(heartbeat_interval_s: {config.heartbeat_interval_s:g}s)")
    if not 0 <= config.window_lead_s <= 60:  # the agents take a start further ahead for a clock that is off
        raise ConfigError(f"window_lead_s must be 0 to 60 seconds, got {config.window_lead_s}")
