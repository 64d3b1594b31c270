"""The store's value types, errors and the backend-neutral `Store` protocol.

Kept apart from the SQLite backend so an etcd backend can implement the same
protocol without importing SQLite. See the package docstring for the semantics.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import AsyncIterator, Protocol, runtime_checkable

PUT = "PUT"
DELETE = "DELETE"


@dataclass(frozen=True, slots=True)
class KeyValue:
    """One version of one key. `mod_revision` is the revision that wrote it."""

    key: str
    value: bytes
    create_revision: int
    mod_revision: int


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One change. For DELETE, `kv` is the last value with the delete's revision."""

    type: str  # PUT or DELETE
    kv: KeyValue
    prev: KeyValue | None  # the value before this event; None on create
    revision: int


class StoreError(Exception):
    """Base of every store refusal; str(err) names the cause."""


class KeyExists(StoreError):
    def __init__(self, key: str, current: KeyValue | None = None) -> None:
        super().__init__(f"key {key!r} already exists")
        self.key = key
        self.current = current


class KeyNotFound(StoreError):
    def __init__(self, key: str) -> None:
        super().__init__(f"key {key!r} not found")
        self.key = key


class Conflict(StoreError):
    """A compare-and-swap failed; `current` is the value the store holds now."""

    def __init__(self, current: KeyValue, expected_mod_revision: int | None = None) -> None:
        super().__init__(
            f"key {current.key!r} was modified: expected revision "
            f"{expected_mod_revision}, current revision {current.mod_revision}"
        )
        self.current = current
        self.key = current.key
        self.expected_mod_revision = expected_mod_revision


class Compacted(StoreError):
    """The requested revision is older than the history the store keeps."""

    def __init__(self, compacted_revision: int, requested_revision: int | None = None) -> None:
        detail = "" if requested_revision is None else f"revision {requested_revision} is "
        super().__init__(
            f"{detail}too old: history before revision {compacted_revision} has been compacted"
        )
        self.compacted_revision = compacted_revision
        self.requested_revision = requested_revision


@runtime_checkable
class Store(Protocol):
    """What the API server needs from a key-value store with revisions and watch."""

    @property
    def current_revision(self) -> int: ...

    @property
    def compacted_revision(self) -> int: ...

    async def get(self, key: str) -> KeyValue | None: ...

    async def list(self, prefix: str) -> tuple[list[KeyValue], int]: ...

    async def create(self, key: str, value: bytes) -> KeyValue: ...

    async def update(self, key: str, value: bytes, expected_mod_revision: int) -> KeyValue: ...

    async def delete(self, key: str, expected_mod_revision: int | None = None) -> KeyValue: ...

    def watch(self, prefix: str, start_revision: int) -> AsyncIterator[WatchEvent]: ...

    async def compact(self, revision: int) -> None: ...

    async def close(self) -> None: ...
