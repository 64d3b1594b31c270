"""The store's value types, errors, argument checks and the backend-neutral `Store` protocol.

Kept apart from the backends so each (SQLite, etcd) implements the same protocol and
refuses the same bad input with the same words, without importing the other.
See the package docstring for the semantics.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import AsyncGenerator, Callable, Protocol, runtime_checkable

PUT = "PUT"
DELETE = "DELETE"
PROGRESS = "PROGRESS"   # a triggered watch's mark: nothing for it up to `revision` (SQLiteStore)


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

    type: str  # PUT or DELETE (PROGRESS: a triggered watch's mark; `kv` is the write's)
    kv: KeyValue
    prev: KeyValue | None  # the value before this event; None on create
    revision: int


class WatchStream:
    """What a backend's watch() returns: its events, and aclose() that also releases what
    watch() subscribed when iteration never started (aclose() of an async generator that
    never ran runs none of its code, so its `finally` cannot)."""

    def __init__(self, events: AsyncGenerator[WatchEvent, None], release: Callable[[], None],
                 progress: Callable[[], bool] | None = None) -> None:
        self._events = events
        self._release = release
        self._progress = progress

    def request_progress(self) -> bool:
        """Ask for a PROGRESS mark at the store's current revision, after every event up
        to it (etcd's WatchProgressRequest, what kube-apiserver's consistent reads from
        its cache wait for).  False: this watch cannot give one now (a backend or a
        watch without marks, one closed or catching up after its queue overflowed)."""
        return self._progress() if self._progress is not None else False

    def __aiter__(self) -> WatchStream:
        return self

    async def __anext__(self) -> WatchEvent:
        return await self._events.__anext__()

    async def aclose(self) -> None:
        self._release()  # idempotent: the generator's own cleanup may release it again
        await self._events.aclose()


@dataclass(frozen=True, slots=True)
class Page:
    """One page of a prefix as it was at `revision`: `items` sorted by key, and how many
    keys under the prefix come after the last of them (0: this page ends the list)."""

    items: list[KeyValue]
    revision: int
    remaining: int


class StoreFigures:
    """The figures every backend keeps of itself, as the Store protocol's properties: the
    newest revision it has seen, the oldest it can still read from, whether it is closed."""

    _revision: int
    _compacted: int
    _closed: bool

    @property
    def current_revision(self) -> int:
        return self._revision

    @property
    def compacted_revision(self) -> int:
        return self._compacted

    @property
    def closed(self) -> bool:
        return self._closed


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


class FutureRevision(StoreError):
    """A read at a revision the store has not reached (kube-apiserver: "Too large resource
    version")."""

    def __init__(self, requested_revision: int, current_revision: int) -> None:
        super().__init__(f"revision {requested_revision} is newer than the store's current "
                         f"revision {current_revision}")
        self.requested_revision = requested_revision
        self.current_revision = current_revision


class ValueTooLarge(StoreError):
    """A value over what the store takes in one write (etcd's request-size limit).

    ``limit`` is the limit the store knows it was over: the client's own (kube32 refuses
    before sending), or None when etcd refused it by a limit it does not tell (an etcd
    started with a smaller --max-request-bytes than kube32 knows)."""

    def __init__(self, key: str, size: int, limit: int | None, detail: str = "") -> None:
        over = (f"over the store's limit of {limit} bytes" if limit is not None
                else "over etcd's request-size limit (--max-request-bytes, smaller than this)")
        super().__init__(
            f"the value of key {key!r} is {size} bytes, {over}" + (f" ({detail})" if detail else "")
        )
        self.key = key
        self.size = size
        self.limit = limit


class Unavailable(StoreError):
    """The store cannot be reached or has no quorum now; a write's outcome may be unknown
    (str(err) says which). Worth retrying later."""


# --- argument checks shared by every backend --------------------------------

def check_key(key: object) -> str:
    if not isinstance(key, str) or not key:
        raise StoreError(f"a key must be a non-empty string, not {key!r}")
    check_text(key, "key")
    return key


def check_prefix(prefix: object) -> str:
    if not isinstance(prefix, str):
        raise StoreError(f"a prefix must be a string, not {prefix!r}")
    check_text(prefix, "prefix")
    return prefix


def check_text(text: str, what: str) -> None:
    if "\x00" in text:
        raise StoreError(f"a {what} must not contain NUL characters: {text!r}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise StoreError(f"a {what} must be valid Unicode (no lone surrogates): {text!r}") from None


def check_value(value: object) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise StoreError(f"a value must be bytes, not {type(value).__name__}")


def check_revision(revision: object, what: str) -> int:
    if isinstance(revision, bool) or not isinstance(revision, int) or revision < 0:
        raise StoreError(f"{what} must be a non-negative integer, not {revision!r}")
    return revision



@runtime_checkable
class Store(Protocol):
    """What the API server needs from a key-value store with revisions and watch."""

    @property
    def current_revision(self) -> int: ...

    @property
    def compacted_revision(self) -> int: ...

    async def get(self, key: str) -> KeyValue | None: ...

    async def list(self, prefix: str) -> tuple[list[KeyValue], int]: ...

    async def page(self, prefix: str, *, after: str = "", limit: int = 0, revision: int = 0,
                   count: bool = True) -> Page:
        """The keys under `prefix` greater than `after`, as they were at `revision`.

        Invariants (what paged lists of the API build on):
        - `revision` 0 reads the current state; the Page names the revision it was read at.
          Any other revision R reads the state exactly as it was after write R: for
          compacted_revision <= R <= the current revision that state is whole (compaction
          keeps every key's latest version at or below R); R < compacted_revision raises
          Compacted, R above the newest revision the backend has raises FutureRevision.
        - Items are sorted by key, each > `after` (`after` need not be a key that exists),
          at most `limit` of them (0: no limit); `remaining` counts the keys under the
          prefix after the last item at that revision, so 0 means the list is complete
          (``count`` False: it may be any number above 0 while keys follow: a list read in
          chunks needs no count of what follows each, which costs the rest of the range).
        - Paging (`after` = the last key of the page before, the same revision) yields
          every key of the state at that revision exactly once, in order, whatever is
          written in between: the pages are one consistent list.
        """
        ...

    async def create(self, key: str, value: bytes) -> KeyValue: ...

    async def update(self, key: str, value: bytes, expected_mod_revision: int) -> KeyValue: ...

    async def delete(self, key: str, expected_mod_revision: int | None = None) -> KeyValue: ...

    def watch(self, prefix: str, start_revision: int) -> WatchStream: ...

    async def compact(self, revision: int) -> None: ...

    async def health(self) -> str | None:
        """None when the store serves requests now; otherwise why not (for /readyz)."""
        ...

    async def close(self) -> None: ...
