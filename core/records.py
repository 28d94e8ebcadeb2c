"""Records one rankscope writes and another, maybe of another version, reads back."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from google.protobuf.message import Message


def known_fields(kind: type, data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` less what the dataclass ``kind`` has no field for: a record written by a
    newer rankscope (a coordinator rolled back, a newer rank wrapper) loads, without what
    was added since."""
    names = {f.name for f in fields(kind)}
    return {key: value for key, value in data.items() if key in names}


def scalars(message: Message) -> dict[str, Any]:
    """A message of scalar fields as a record: every field, its default included (protobuf's
    JSON leaves defaults out, and makes int64s text)."""
    return {f.name: getattr(message, f.name) for f in message.DESCRIPTOR.fields}
