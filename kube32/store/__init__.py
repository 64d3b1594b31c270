"""kube32.store: the object store under the API server (imports nothing above it).

Interface (the contract with kube32.apiserver; SQLiteStore and EtcdStore implement it)::

    from kube32.store import (Store, SQLiteStore, KeyValue, WatchEvent, StoreError,
                              KeyExists, KeyNotFound, Conflict, Compacted,
                              ValueTooLarge, Unavailable)
    from kube32.store.config import parse_store              # --store sqlite | etcd://...
    from kube32.store.opening import open_store
    from kube32.store.etcd import EtcdStore                   # imports grpc: the [etcd] extra

    @dataclass(frozen=True) class KeyValue:
        key: str; value: bytes; create_revision: int; mod_revision: int
    @dataclass(frozen=True) class WatchEvent:
        type: str                 # "PUT" or "DELETE"
        kv: KeyValue              # for DELETE: the last value, mod_revision = the delete's revision
        prev: KeyValue | None     # the value before this event (None on create)
        revision: int

    class Store(Protocol):
        current_revision: int     # property: the revision of the latest write (0 when empty)
        compacted_revision: int   # property: history at or below it may be gone
        async def get(key) -> KeyValue | None
        async def list(prefix) -> tuple[list[KeyValue], int]    # sorted by key; + read revision
        async def page(prefix, *, after="", limit=0, revision=0) -> Page
                                          # keys > after, <= limit of them, as at revision
                                          # (0: now); Page(items, revision, remaining);
                                          # Compacted / FutureRevision (see base.Store.page)
        async def create(key, value) -> KeyValue                # KeyExists(key, current)
        async def update(key, value, expected_mod_revision) -> KeyValue
                                          # KeyNotFound(key) / Conflict(current KeyValue)
                                          # extension: expected_mod_revision=None = unconditional
        async def delete(key, expected_mod_revision=None) -> KeyValue
                                          # the deleted KV with mod_revision = the delete's
                                          # revision; KeyNotFound / Conflict
        def watch(prefix, start_revision) -> WatchStream
        async def compact(revision) -> None
        async def health() -> str | None  # None: serving; else why not (etcd: no quorum)
        async def close() -> None

    class SQLiteStore(Store):
        def __init__(path, history=10000, *, compact_every=1000, watch_queue_size=1000)
        @classmethod async def open(path, history=10000, **options) -> SQLiteStore
        watcher_count: int        # live subscriptions (for tests and metrics)

    class EtcdStore(Store):   # kube32.store.etcd: see its docstring for the mapping
        def __init__(endpoints, *, prefix="", request_timeout=10.0,
                     compact_interval=300.0, max_value_bytes=4 MiB - 64 KiB)
        @classmethod async def open(endpoints, **options) -> EtcdStore

    errors: StoreError (base; str(err) names the cause)
            KeyExists(.key, .current)  KeyNotFound(.key)
            Conflict(.current, .key, .expected_mod_revision)
            Compacted(.compacted_revision, .requested_revision) -> the API's 410 Gone
            FutureRevision(.requested_revision, .current_revision) -> 504 (a read
                                at a revision not reached yet)
            ValueTooLarge(.key, .size, .limit) -> 413 (etcd: its request-size limit; .limit None:
                                                  etcd refused it, its limit unknown)
            Unavailable -> 503 (etcd: no member answers, no quorum, or a write's
                                outcome is unknown)

Semantics and invariants:
- One global revision counter. Every successful create/update/delete bumps it by
  exactly one, across all keys; failed writes change nothing. `create_revision` is
  the revision that created the key (a delete then a create starts a new lifetime).
  The revision survives a restart: reopening the file continues after the last one.
- Keys are non-empty str without NUL; values are opaque bytes. A prefix matches by
  plain string prefix: callers pass a trailing "/" ("/pods/default/") so that
  "/pods/default-x/..." is not matched.
- list() returns the current state sorted by key, and the revision it was read at
  (read and revision are taken atomically: nothing runs between them).
- watch(prefix, N) yields every event under prefix with revision > N, in revision
  order, each exactly once: first replayed from the log, then live, with no gap
  and no duplicate between the two (writes during the replay are delivered after
  it). The subscription starts when watch() is called, not at the first iteration:
  N = 0 means "from now" (the revision when watch() is called), and such a watch
  never raises Compacted unless it later falls behind (see below). If N is older
  than compacted_revision (N < compacted_revision, N != 0), the first iteration
  raises Compacted; watching from compacted_revision itself is fine because every
  event after it is kept. An N above current_revision waits for revisions > N.
  Close iterators you stop using (aclose()): that ends the subscription even when
  iteration never started (watch() returns a WatchStream, not a bare generator).
- Live delivery: each write fans out, after its commit and before the write call
  returns, to the subscribed watchers through bounded queues (watch_queue_size).
  Writers never wait for readers. A reader whose queue overflows is unsubscribed and
  transparently catches up from the log, so it still sees every event; if it fell
  so far behind that the log was compacted past it, its iterator raises Compacted.
  Watchers are grouped by prefix: a write costs one prefix test per distinct prefix
  plus O(1) per interested watcher.
- close() ends every live watch iterator (normally, without an error); any other
  call on a closed store raises StoreError("the store is closed").
- compact(R) drops history at or below R (R <= current_revision, else StoreError;
  R <= compacted_revision is a no-op). The current value of every key survives.
  SQLiteStore also compacts itself every `compact_every` writes, keeping at least
  the last `history` revisions; EtcdStore every `compact_interval` seconds, keeping
  at least one interval (kube-apiserver's compactor, shared by every API server).
- Several stores on one backend (EtcdStore: several API servers on one etcd) share
  its one revision counter: a store's current_revision is the newest revision it has
  seen, and "bumps by exactly one" holds for the cluster, not for each client; a
  compare-and-swap by one fails with Conflict against another's newer write.

SQLiteStore design (kine, the SQLite backend of k3s): an append-only `log` table
(revision INTEGER PRIMARY KEY, key, value, create_revision, prev_revision, deleted)
plus a `current` table (key -> revision of its latest log row) so get/list never
scan history; watch replay is a range scan of `log` by revision. One writer: the
event loop calls sqlite3 directly (each call is a few tens of microseconds), WAL
with synchronous=NORMAL (a commit survives a crash of the process, the last ones
may be lost on power loss), and an exclusive lock on the file so a second process
opening it gets StoreError("... is in use ..."). See sqlite.py.
"""

from .base import (
    PROGRESS,
    DELETE,
    PUT,
    Compacted,
    Conflict,
    FutureRevision,
    KeyExists,
    KeyNotFound,
    KeyValue,
    Page,
    Store,
    StoreError,
    Unavailable,
    ValueTooLarge,
    WatchEvent,
    WatchStream,
)
from .sqlite import SQLiteStore

__all__ = [
    "DELETE",
    "PROGRESS",
    "PUT",
    "Compacted",
    "Conflict",
    "FutureRevision",
    "KeyExists",
    "KeyNotFound",
    "KeyValue",
    "Page",
    "SQLiteStore",
    "Store",
    "StoreError",
    "Unavailable",
    "ValueTooLarge",
    "WatchEvent",
    "WatchStream",
]
