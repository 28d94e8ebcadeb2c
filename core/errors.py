"""Errors raised by rankscope.

Every error a user can cause is a :class:`RankscopeError`; the CLI catches it once
and prints one line naming the file and the problem, then exits with ``exit_code``.

RankscopeError
 ├── InputError (ValueError)         bad file, bad flag, bad content: exit 2
 │    ├── ExportError                  a profiler export cannot be read or is empty
 │    ├── ConsistencyError             exports disagree (same rank twice, different jobs)
 │    └── CommandError                 a wrapped command cannot start: exit 127 / 126, as a shell
 ├── ConfigError (ValueError)        bad configuration
 ├── ToolError (RuntimeError)        nsys / dcgmi / a backend failed on the node
 ├── TransportError (ConnectionError) coordinator or agent unreachable
 └── UploadRejected (ValueError)     an upload failed validation (offset, checksum, name, size)
"""

from __future__ import annotations

from pathlib import Path


class RankscopeError(Exception):
    """Root of every rankscope error."""

    exit_code = 1

    def __init__(self, message: str, *, path: str | Path | None = None) -> None:
        self.path = None if path is None else str(path)
        super().__init__(message)

    def __str__(self) -> str:
        message = super().__str__()
        return f"{shown(self.path)}: {message}" if self.path else message


class InputError(RankscopeError, ValueError):
    exit_code = 2


class ExportError(InputError):
    """A profiler export (nsys SQLite, Kineto JSON, digest) cannot be used."""


class ConsistencyError(InputError):
    """Several inputs contradict each other."""


class CommandError(InputError):
    """The command a wrapper was given cannot be started: 127 where it is not found, 126
    where it cannot be executed, as a shell exits."""

    def __init__(self, message: str, *, path: str | Path | None = None, exit_code: int = 127) -> None:
        super().__init__(message, path=path)
        self.exit_code = exit_code


class ConfigError(RankscopeError, ValueError):
    exit_code = 2


class ToolError(RankscopeError, RuntimeError):
    """An external tool (nsys, dcgmi, DCGM bindings) failed."""


class TransportError(RankscopeError, ConnectionError):
    """A peer (coordinator, agent) could not be reached."""


class CallTimedOut(TransportError):
    """A call went out and its answer did not come in time: what it asked for may be done."""


class UploadRejected(RankscopeError, ValueError):
    exit_code = 2


class RankscopeWarning(UserWarning):
    """Something was inferred or skipped; the result is usable but say so."""


def quoted(text: str, limit: int = 64) -> str:
    """A value from the user or a file, quoted for a message: its first ``limit`` characters
    where it runs long (a name of a megabyte would be the whole message)."""
    return f"{text[:limit]!r}{'...' if len(text) > limit else ''}"


def shown(path: str | Path) -> str:
    """A file's name for a message: as it is, or quoted with its escapes where it holds a
    character not shown as itself (a newline ended the message's line, or, made one line,
    showed as a space: the name of another file)."""
    text = str(path)
    return text if text.isprintable() else repr(text)
