"""SQLiteStore: the revisioned log of kine (k3s' SQLite backend), for one process.

Tables:
  log(revision INTEGER PRIMARY KEY, key, value, create_revision, prev_revision, deleted)
      append-only: one row per write. A delete row carries the deleted value.
      prev_revision is the revision of the key's previous row (0 on create).
  current(key PRIMARY KEY, revision) WITHOUT ROWID
      the live keys, each pointing at its latest log row, so get/list never scan history.
  meta(name PRIMARY KEY, value)
      schema version and compacted_revision.

Invariants:
  - current_revision = max(MAX(log.revision), compacted_revision): compaction only removes
    rows at or below compacted_revision, so the counter never goes back after a restart.
  - Every log row with revision > compacted_revision is present, and so is every row they
    name as prev_revision: compaction of (old, new] deletes exactly the rows superseded by a
    row in that range, and the delete rows in it.
  - Writes run synchronously in the event loop (one writer); fan-out to watchers happens
    after the commit, in revision order, before the write call returns.
  - Triggered watches (`watch_triggered`, as Kubernetes' watch cache indexes its watchers
    by ``spec.nodeName``): a watch given a trigger value is pushed only the live events
    whose trigger values (`set_trigger`'s function of the event, for its prefix) hold it,
    so a write reaches the few watchers it may concern, not a thousand nodes' each; and,
    at most every `PROGRESS_SECONDS` of writes, a ``PROGRESS`` event at the write's
    revision (nothing for it up to there: as etcd's progress notifications), so its
    bookmarks keep up.  Replays from the log are filtered by the same function.
    `watch_progress`: an untriggered watch that takes those PROGRESS marks too (a quiet
    prefix's watch, resumed after its timeout, would otherwise resume from a compacted
    revision and list again: at 1,000 nodes the controllers' pods informer did).
    Its stream's `request_progress()` queues a PROGRESS mark at the current revision
    behind what the watch was pushed: the watch has then read every event up to the
    store's current revision (a consistent read from a watch-fed cache waits for it:
    kube32.apiserver.nodeindex).
"""

from __future__ import annotations

import asyncio
import builtins
import sqlite3
from collections import deque
from contextlib import contextmanager
import time
from pathlib import Path
from typing import Any, AsyncGenerator, Callable, Iterable, Iterator

from .base import (
    StoreFigures,
    DELETE,
    PROGRESS,
    PUT,
    Compacted,
    Conflict,
    FutureRevision,
    KeyExists,
    KeyNotFound,
    KeyValue,
    Page,
    StoreError,
    WatchEvent,
    WatchStream,
    check_key,
    check_prefix,
    check_revision,
    check_value,
)

SCHEMA_VERSION = 1

HISTORY_SECONDS = 300.0   # the API server's store keeps at least this long of history too (opening.py)
PROGRESS_SECONDS = 10.0   # PROGRESS marks, at most this often (writes permitting): within a bookmark interval

_SCHEMA = """
CREATE TABLE IF NOT EXISTS log (
    revision INTEGER PRIMARY KEY,
    key TEXT NOT NULL,
    value BLOB NOT NULL,
    create_revision INTEGER NOT NULL,
    prev_revision INTEGER NOT NULL,
    deleted INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS current (
    key TEXT PRIMARY KEY,
    revision INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS meta (
    name TEXT PRIMARY KEY,
    value INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS log_key_revision ON log(key, revision);
"""

_GET = (
    "SELECT l.value, l.create_revision, l.revision FROM current c "
    "JOIN log l ON l.revision = c.revision WHERE c.key = ?"
)
_LIST_COLUMNS = (
    "SELECT c.key, l.value, l.create_revision, l.revision FROM current c "
    "JOIN log l ON l.revision = c.revision "
)
# The state at a past revision: each key's latest row at or below it, unless a delete.
# (SQLite takes the bare columns of a MAX() aggregate from the row holding the maximum.)
# Each key's latest revision comes from the index on (key, revision) alone (SQLite reads
# the index entries of the range, not the rows); only the rows of the page are read whole.  Without the index this
# read every logged version of the range, values and all, for each page (issue 25: the
# second page of a list of a thousand pods, a write after its first, scanned the log).
_STATE_AT = (
    "SELECT l.key, l.value, l.create_revision, l.revision FROM (SELECT key, MAX(revision) AS rev "
    "FROM log WHERE revision <= ? AND {range} AND key > ? GROUP BY key ORDER BY key) m "
    "JOIN log l ON l.revision = m.rev WHERE l.deleted = 0 ORDER BY l.key"
)
_REPLAY_COLUMNS = (
    "SELECT l.revision, l.key, l.value, l.create_revision, l.prev_revision, l.deleted, "
    "p.value, p.create_revision FROM log l LEFT JOIN log p ON p.revision = l.prev_revision "
    "WHERE l.revision > ? AND l.revision <= ? "
)

_MAX_CODE_POINT = 0x10FFFF
_SURROGATES = range(0xD800, 0xE000)


def prefix_end(prefix: str) -> str | None:
    """The smallest string greater than every string starting with `prefix` (None: no bound).

    SQLite compares TEXT as UTF-8 bytes, which orders like code points, so bumping
    the last code point that can be bumped gives an exclusive upper bound.
    """
    chars = list(prefix)
    while chars:
        last = ord(chars.pop())
        if last < _MAX_CODE_POINT:
            nxt = last + 1
            if nxt in _SURROGATES:
                nxt = _SURROGATES.stop
            return "".join(chars) + chr(nxt)
    return None


class _Watcher:
    """One live subscription: a bounded queue the writer appends to without waiting."""

    __slots__ = ("prefix", "events", "wakeup", "limit", "lagged", "closed", "trigger", "progress")

    def __init__(self, prefix: str, limit: int, trigger: str | None = None, progress: bool = False) -> None:
        self.prefix = prefix
        self.trigger = trigger
        self.progress = progress
        self.events: deque[WatchEvent] = deque()
        self.wakeup = asyncio.Event()
        self.limit = limit
        self.lagged = False
        self.closed = False

    def push(self, event: WatchEvent) -> bool:
        """Queue `event`; False (and the queue dropped) when the reader fell too far behind."""
        if len(self.events) >= self.limit:
            # The reader will catch up from the log instead; the writer never waits.
            self.lagged = True
            self.events.clear()
            self.wakeup.set()
            return False
        self.events.append(event)
        self.wakeup.set()
        return True

    def close(self) -> None:
        self.closed = True
        self.wakeup.set()

    async def next(self) -> WatchEvent | None:
        """The next live event, or None when lagged or closed."""
        while not self.events:
            if self.lagged or self.closed:
                return None
            self.wakeup.clear()
            await self.wakeup.wait()
        return self.events.popleft()


class SQLiteStore(StoreFigures):
    """A `Store` in one SQLite file (or ":memory:"), owned by one process and one event loop."""

    replay_page_size = 500

    def __init__(
        self,
        path: str | Path,
        history: int = 10000,
        *,
        compact_every: int = 1000,
        watch_queue_size: int = 1000,
        history_seconds: float = 0.0,
    ) -> None:
        if history < 0 or compact_every < 1 or watch_queue_size < 1:
            raise StoreError(
                "history must be >= 0, compact_every and watch_queue_size must be >= 1"
            )
        self._path = str(path)
        self._history = history
        self._history_seconds = history_seconds
        self._compact_every = compact_every
        self._watch_queue_size = watch_queue_size
        self._writes_since_compact = 0
        self._watchers: dict[str, set[_Watcher]] = {}
        # prefix -> trigger value -> its watchers; prefix -> the function of an event's values
        self._triggered: dict[str, dict[str, set[_Watcher]]] = {}
        self._triggers: dict[str, Callable[[WatchEvent], Iterable[str]]] = {}
        self._progress_at = 0.0
        self._marks: deque[tuple[float, int]] = deque()   # (monotonic time, revision) at each compaction round
        self._progress_watchers: set[_Watcher] = set()   # those that take PROGRESS marks
        self.pushed = 0   # events pushed to watchers (a test counts them)
        self._closed = False
        self._db = self._connect(self._path)
        self._compacted = self._meta("compacted_revision")
        (last,) = self._db.execute("SELECT COALESCE(MAX(revision), 0) FROM log").fetchone()
        self._revision = max(last, self._compacted)

    @classmethod
    async def open(cls, path: str | Path, history: int = 10000, **options: Any) -> SQLiteStore:
        return cls(path, history, **options)

    # --- opening -----------------------------------------------------------

    @staticmethod
    def _connect(path: str) -> sqlite3.Connection:
        try:
            db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as err:
            raise StoreError(f"cannot open the store {path!r}: {err}") from err
        try:
            # Exclusive locking: one process owns the file (a second opener fails fast
            # instead of racing the in-memory revision counter), and WAL needs no shm.
            db.execute("PRAGMA busy_timeout = 0")
            db.execute("PRAGMA locking_mode = EXCLUSIVE")
            db.execute("PRAGMA journal_mode = WAL")
            db.execute("PRAGMA synchronous = NORMAL")
            db.execute("BEGIN IMMEDIATE")
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    db.execute(statement)
            row = db.execute("SELECT value FROM meta WHERE name = 'schema'").fetchone()
            if row is None:
                db.execute("INSERT INTO meta(name, value) VALUES ('schema', ?)", (SCHEMA_VERSION,))
            elif row[0] != SCHEMA_VERSION:
                raise StoreError(
                    f"the store {path!r} has schema version {row[0]}, "
                    f"this program reads version {SCHEMA_VERSION}"
                )
            db.execute("COMMIT")
        except sqlite3.OperationalError as err:
            db.close()
            if "locked" in str(err) or "busy" in str(err):
                raise StoreError(
                    f"the store {path!r} is in use (opened by another store or process)"
                ) from err
            raise StoreError(f"cannot open the store {path!r}: {err}") from err
        except sqlite3.DatabaseError as err:
            db.close()
            raise StoreError(f"{path!r} is not a Kube32 store: {err}") from err
        except BaseException:
            db.close()
            raise
        return db

    def _meta(self, name: str) -> int:
        row = self._db.execute("SELECT value FROM meta WHERE name = ?", (name,)).fetchone()
        return 0 if row is None else int(row[0])

    # --- properties --------------------------------------------------------

    # --- reads -------------------------------------------------------------

    async def get(self, key: str) -> KeyValue | None:
        return self._get(check_key(key))

    def _get(self, key: str) -> KeyValue | None:
        self._check_open()
        try:
            row = self._db.execute(_GET, (key,)).fetchone()
        except sqlite3.Error as err:
            raise StoreError(f"cannot read key {key!r}: {err}") from err
        return None if row is None else KeyValue(key, row[0], row[1], row[2])

    async def list(self, prefix: str) -> tuple[list[KeyValue], int]:
        self._check_open()
        sql, params = self._key_range("c.key", check_prefix(prefix))
        try:
            rows = self._db.execute(
                _LIST_COLUMNS + "WHERE " + sql + " ORDER BY c.key", params
            ).fetchall()
        except sqlite3.Error as err:
            raise StoreError(f"cannot list prefix {prefix!r}: {err}") from err
        return [KeyValue(k, v, c, m) for k, v, c, m in rows], self._revision

    async def page(self, prefix: str, *, after: str = "", limit: int = 0, revision: int = 0,
                   count: bool = True) -> Page:
        """See Store.page. The current state reads `current`; a past revision groups the
        log by key (history is bounded by compaction, so this scan is too)."""
        self._check_open()
        prefix, limit = check_prefix(prefix), check_revision(limit, "the page limit")
        revision = check_revision(revision, "the page revision")
        if not isinstance(after, str):
            raise StoreError(f"a page's start must be a key, not {after!r}")
        at = revision or self._revision
        if at > self._revision:
            raise FutureRevision(at, self._revision)
        if revision and at < self._compacted:
            raise Compacted(self._compacted, at)
        current = revision == 0 or at == self._revision
        try:
            rows = self._page_rows(prefix, after, at, current, (limit + (0 if count else 1)) if limit else -1)
            remaining = 0
            if limit and not count:
                remaining = 1 if len(rows) > limit else 0   # more follow: how many is not asked
                del rows[limit:]
            elif limit and len(rows) == limit:
                remaining = self._page_rows(prefix, rows[-1][0], at, current, -1, count=True)[0][0]
        except sqlite3.Error as err:
            raise StoreError(f"cannot list prefix {prefix!r} at revision {at}: {err}") from err
        return Page([KeyValue(k, v, c, m) for k, v, c, m in rows], at, remaining)

    def _page_rows(self, prefix: str, after: str, at: int, current: bool, limit: int,
                   count: bool = False) -> builtins.list[tuple]:
        """The rows of a page (key, value, create_revision, mod_revision); with `count`
        one row of their number."""
        params: tuple[object, ...]
        if current and count:
            # The current state's keys alone: an index range, no value read (a list read a
            # chunk at a time counts what remains after each chunk).
            sql, params = self._key_range("key", prefix)
            query = "SELECT key FROM current WHERE " + sql + " AND key > ? ORDER BY key LIMIT ?"
        elif current:
            sql, params = self._key_range("c.key", prefix)
            query = _LIST_COLUMNS + "WHERE " + sql + " AND c.key > ? ORDER BY c.key LIMIT ?"
        elif not count:
            return self._past_rows(prefix, after, at, limit)
        else:
            sql, keys = self._key_range("key", prefix)
            query = _STATE_AT.format(range=sql) + " LIMIT ?"
            params = (at, *keys)
        if count:
            query = f"SELECT COUNT(*) FROM ({query})"
        return self._db.execute(query, (*params, after, limit)).fetchall()

    def _past_rows(self, prefix: str, after: str, at: int, limit: int) -> builtins.list[tuple]:
        """A page at a past revision: each key's latest revision at or below ``at``, the
        next ``limit`` keys after ``after`` read along the index on (key, revision) and
        no further (its GROUP BY follows the index, so the LIMIT stops it), then those
        rows; keys deleted at ``at`` are skipped, and more read while the page is short.
        O(the page's keys and their versions), not O(the rest of the range)."""
        sql, keys = self._key_range("key", prefix)
        heads = ("SELECT key, MAX(revision) FROM log WHERE revision <= ? AND " + sql
                 + " AND key > ? GROUP BY key ORDER BY key LIMIT ?")
        out: builtins.list[tuple] = []
        while True:
            want = limit - len(out) if limit >= 0 else -1
            groups = self._db.execute(heads, (at, *keys, after, want)).fetchall()
            if not groups:
                return out
            revs = [r for _, r in groups]
            rows = self._db.execute(
                "SELECT key, value, create_revision, revision, deleted FROM log WHERE revision IN ("
                + ",".join("?" * len(revs)) + ") ORDER BY key", revs).fetchall()
            out += [r[:4] for r in rows if not r[4]]
            after = groups[-1][0]
            if want < 0 or len(groups) < want or len(out) >= limit:
                return out

    @staticmethod
    def _key_range(column: str, prefix: str) -> tuple[str, tuple[str, ...]]:
        end = prefix_end(prefix)
        if end is None:
            return f"{column} >= ?", (prefix,)
        return f"{column} >= ? AND {column} < ?", (prefix, end)

    # --- writes ------------------------------------------------------------

    async def create(self, key: str, value: bytes) -> KeyValue:
        key, value = check_key(key), check_value(value)
        current = self._get(key)
        if current is not None:
            raise KeyExists(key, current)
        revision = self._revision + 1
        kv = KeyValue(key, value, revision, revision)
        self._append(kv, prev_revision=0, deleted=False)
        self._publish(WatchEvent(PUT, kv, None, revision))
        return kv

    async def update(
        self, key: str, value: bytes, expected_mod_revision: int | None
    ) -> KeyValue:
        """Replace `key`'s value if its mod_revision is `expected_mod_revision`.

        None (an extension of the interface) means "whatever the current revision is".
        """
        key, value = check_key(key), check_value(value)
        current = self._current_for_write(key, expected_mod_revision)
        revision = self._revision + 1
        kv = KeyValue(key, value, current.create_revision, revision)
        self._append(kv, prev_revision=current.mod_revision, deleted=False)
        self._publish(WatchEvent(PUT, kv, current, revision))
        return kv

    async def delete(self, key: str, expected_mod_revision: int | None = None) -> KeyValue:
        key = check_key(key)
        current = self._current_for_write(key, expected_mod_revision)
        revision = self._revision + 1
        kv = KeyValue(key, current.value, current.create_revision, revision)
        self._append(kv, prev_revision=current.mod_revision, deleted=True)
        self._publish(WatchEvent(DELETE, kv, current, revision))
        return kv

    def _current_for_write(self, key: str, expected_mod_revision: int | None) -> KeyValue:
        if expected_mod_revision is not None:
            check_revision(expected_mod_revision, "expected_mod_revision")
        current = self._get(key)
        if current is None:
            raise KeyNotFound(key)
        if expected_mod_revision is not None and current.mod_revision != expected_mod_revision:
            raise Conflict(current, expected_mod_revision)
        return current

    def _append(self, kv: KeyValue, *, prev_revision: int, deleted: bool) -> None:
        """Write one log row and point (or stop pointing) `current` at it, atomically."""
        with self._transaction(f"write key {kv.key!r}") as db:
            db.execute(
                "INSERT INTO log(revision, key, value, create_revision, prev_revision, deleted)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (kv.mod_revision, kv.key, kv.value, kv.create_revision, prev_revision,
                 int(deleted)),
            )
            if deleted:
                db.execute("DELETE FROM current WHERE key = ?", (kv.key,))
            else:
                db.execute(
                    "INSERT INTO current(key, revision) VALUES (?, ?) "
                    "ON CONFLICT(key) DO UPDATE SET revision = excluded.revision",
                    (kv.key, kv.mod_revision),
                )
        self._revision = kv.mod_revision

    @contextmanager
    def _transaction(self, what: str) -> Iterator[sqlite3.Connection]:
        """BEGIN ... COMMIT, rolled back on any error; SQLite's errors become StoreError
        naming ``what`` failed."""
        db = self._db
        try:
            db.execute("BEGIN")
            try:
                yield db
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
        except sqlite3.Error as err:
            raise StoreError(f"cannot {what}: {err}") from err

    def _publish(self, event: WatchEvent) -> None:
        lagged: builtins.list[_Watcher] = []
        key = event.kv.key
        # Watchers are grouped by prefix: the per-write cost is one startswith per
        # distinct prefix plus one O(1) append per interested watcher.
        reached: set[_Watcher] = set()
        for prefix, watchers in self._watchers.items():
            if key.startswith(prefix):
                for watcher in watchers:
                    self.pushed += 1
                    if watcher.progress:
                        reached.add(watcher)
                    if not watcher.push(event):
                        lagged.append(watcher)
        if self._triggered:
            self._publish_triggered(event, reached, lagged)
        if self._progress_watchers:
            self._publish_progress(event, reached, lagged)
        for watcher in lagged:
            self._unsubscribe(watcher)
        self._writes_since_compact += 1
        if self._writes_since_compact >= self._compact_every:
            self._writes_since_compact = 0
            self._compact_automatically()

    def _publish_triggered(self, event: WatchEvent, reached: set[_Watcher], lagged: builtins.list[_Watcher]) -> None:
        """Push ``event`` to the triggered watchers its values concern (O(those)), adding
        them to ``reached``."""
        key = event.kv.key
        values: Iterable[str] | None = None
        for prefix, by_value in self._triggered.items():
            if not key.startswith(prefix):
                continue
            if values is None:
                fn = next((f for p, f in self._triggers.items() if key.startswith(p)), None)
                values = set(fn(event)) if fn is not None else set(by_value)
            for value in values:
                for watcher in by_value.get(value, ()):
                    reached.add(watcher)
                    self.pushed += 1
                    if not watcher.push(event):
                        lagged.append(watcher)

    def _publish_progress(self, event: WatchEvent, reached: set[_Watcher], lagged: builtins.list[_Watcher]) -> None:
        """At most every PROGRESS_SECONDS: a PROGRESS mark at this write's revision to every
        watcher that takes them and was not pushed this event (O(watchers) once a second)."""
        now = time.monotonic()
        if now - self._progress_at < PROGRESS_SECONDS:
            return
        self._progress_at = now
        mark = WatchEvent(PROGRESS, event.kv, None, event.revision)
        for watcher in self._progress_watchers:
            if watcher not in reached:
                self.pushed += 1
                if not watcher.push(mark):
                    lagged.append(watcher)

    def _concerns(self, watcher: _Watcher, event: WatchEvent) -> bool:
        """Whether a replayed event is the watcher's: a triggered watch's only when its
        trigger values hold the watch's (so a watch resumed from a revision a while back
        reads the events of its node, not every pod event since, each decoded)."""
        if watcher.trigger is None:
            return True
        fn = next((f for p, f in self._triggers.items() if event.kv.key.startswith(p)), None)
        return fn is None or watcher.trigger in set(fn(event))

    def set_trigger(self, prefix: str, values: Callable[[WatchEvent], Iterable[str]]) -> None:
        """The trigger values of an event under ``prefix`` (the module docstring)."""
        self._triggers[check_prefix(prefix)] = values

    def watch_triggered(self, prefix: str, start_revision: int, trigger: str) -> WatchStream:
        """`watch`, but live events only when their trigger values hold ``trigger`` (and
        PROGRESS marks); see the module docstring."""
        return self._watch(prefix, start_revision, trigger, True)

    def watch_progress(self, prefix: str, start_revision: int) -> WatchStream:
        """`watch` with PROGRESS marks (the module docstring): a watch of a quiet prefix
        learns the store's revision, so its bookmarks keep up and a resume from them is
        not compacted away (as etcd's progress notifications)."""
        return self._watch(prefix, start_revision, None, True)

    def _compact_automatically(self) -> None:
        # At least `history` revisions, and at least `history_seconds` of them (as
        # kube-apiserver compacts etcd every 5 minutes): a fleet writes hundreds of times a
        # second, and a watch resumed from a bookmark a few seconds old must find its
        # revision still there, or a thousand kubelets list every pod again (issue 25).
        now = time.monotonic()
        self._marks.append((now, self._revision))
        keep = self._history_seconds
        while len(self._marks) > 1 and self._marks[1][0] <= now - keep:
            self._marks.popleft()
        old_enough = self._marks[0][1] if self._marks[0][0] <= now - keep else 0
        target = min(self._revision - self._history, old_enough)
        if target <= self._compacted:
            return
        try:
            self._compact(target)
        except StoreError:
            # The write that got here has succeeded; a failed compaction only keeps
            # more history, and the next round tries again.
            pass

    # --- compaction --------------------------------------------------------

    async def health(self) -> str | None:
        """A file in this process: serving unless closed."""
        return "the store is closed" if self._closed else None

    async def compact(self, revision: int) -> None:
        """Drop history at or below `revision`; a no-op if already compacted that far."""
        self._check_open()
        check_revision(revision, "the compaction revision")
        if revision > self._revision:
            raise StoreError(
                f"cannot compact to revision {revision}: the current revision is {self._revision}"
            )
        if revision > self._compacted:
            self._compact(revision)

    def _compact(self, revision: int) -> None:
        low = self._compacted
        with self._transaction(f"compact to revision {revision}") as db:
            # Every row superseded by a row in (low, revision] is named by its
            # prev_revision; rows superseded earlier went in earlier compactions.
            db.execute(
                "DELETE FROM log WHERE revision IN (SELECT prev_revision FROM log "
                "WHERE revision > ? AND revision <= ? AND prev_revision > 0)",
                (low, revision),
            )
            db.execute(
                "DELETE FROM log WHERE revision > ? AND revision <= ? AND deleted = 1",
                (low, revision),
            )
            db.execute(
                "INSERT INTO meta(name, value) VALUES ('compacted_revision', ?) "
                "ON CONFLICT(name) DO UPDATE SET value = excluded.value",
                (revision,),
            )
        self._compacted = revision

    # --- watch -------------------------------------------------------------

    def watch(self, prefix: str, start_revision: int) -> WatchStream:
        return self._watch(prefix, start_revision, None, False)

    def _watch(self, prefix: str, start_revision: int, trigger: str | None, progress: bool) -> WatchStream:
        """Events with revision > start_revision under `prefix`: replayed, then live.

        The subscription starts at this call, not at the first iteration: with
        start_revision 0 ("from now") nothing written in between is missed, and a
        compaction in between cannot make a "from now" watch fail. aclose() ends the
        subscription even when iteration never started.
        """
        now = self._revision
        first = None
        if isinstance(prefix, str) and not self._closed:
            first = self._subscribe(prefix, trigger, progress)
        live: builtins.list[_Watcher | None] = [first]   # the subscription now (a new one after an overflow)

        def release() -> None:
            if first is not None:
                self._unsubscribe(first)

        def request() -> bool:
            watcher = live[0]
            if watcher is None or watcher.lagged or watcher.closed or self._closed:
                return False
            mark = WatchEvent(PROGRESS, KeyValue(prefix, b"", 0, self._revision), None, self._revision)
            if not watcher.push(mark):
                self._unsubscribe(watcher)
                return False
            return True

        return WatchStream(self._stream(prefix, start_revision, now, first, live), release,
                           request if progress else None)

    async def _stream(
        self, prefix: str, start: int, now: int, first: _Watcher | None,
        live_watcher: builtins.list[_Watcher | None] | None = None,
    ) -> AsyncGenerator[WatchEvent, None]:
        try:
            prefix = check_prefix(prefix)
            cursor = check_revision(start, "start_revision") or now
            if start != 0 and cursor < self._compacted:
                raise Compacted(self._compacted, cursor)
            # A subscription and the revision read with no await in between split the
            # stream exactly: the log holds (cursor, upto], the queue (upto, ...).
            watcher, upto = first, now
            while watcher is not None:
                try:
                    while cursor < upto and not self._closed:
                        page = self._replay_page(prefix, cursor, upto)
                        for event in page:
                            if self._concerns(watcher, event):
                                yield event
                            cursor = event.revision
                        if len(page) < self.replay_page_size:
                            cursor = upto
                    while (live := await watcher.next()) is not None:
                        # (a start_revision in the future; a requested PROGRESS mark may
                        # be at the revision the replay ended at)
                        if live.revision > cursor or (live.type == PROGRESS and live.revision == cursor):
                            yield live
                            cursor = live.revision
                finally:
                    self._unsubscribe(watcher)
                if watcher.closed or self._closed:
                    return
                # The queue overflowed (the reader was slow): catch up from the log.
                watcher, upto = self._subscribe(prefix, watcher.trigger, watcher.progress), self._revision
                if live_watcher is not None:
                    live_watcher[0] = watcher
        finally:
            if first is not None:
                self._unsubscribe(first)

    def _replay_page(self, prefix: str, after: int, upto: int) -> builtins.list[WatchEvent]:
        self._check_open()
        if after < self._compacted:
            raise Compacted(self._compacted, after)
        sql, params = self._key_range("l.key", prefix)
        try:
            rows = self._db.execute(
                _REPLAY_COLUMNS + "AND " + sql + " ORDER BY l.revision LIMIT ?",
                (after, upto, *params, self.replay_page_size),
            ).fetchall()
        except sqlite3.Error as err:
            raise StoreError(f"cannot read the history after revision {after}: {err}") from err
        return [self._event_from_row(row) for row in rows]

    @staticmethod
    def _event_from_row(row: tuple) -> WatchEvent:
        revision, key, value, create_rev, prev_rev, deleted, prev_value, prev_create = row
        kv = KeyValue(key, value, create_rev, revision)
        prev = None
        if prev_rev:
            prev = KeyValue(key, prev_value, prev_create, prev_rev)
        return WatchEvent(DELETE if deleted else PUT, kv, prev, revision)

    def _subscribe(self, prefix: str, trigger: str | None = None, progress: bool = False) -> _Watcher:
        watcher = _Watcher(prefix, self._watch_queue_size, trigger, progress)
        if progress:
            self._progress_watchers.add(watcher)
        if trigger is not None:
            self._triggered.setdefault(prefix, {}).setdefault(trigger, set()).add(watcher)
        else:
            self._watchers.setdefault(prefix, set()).add(watcher)
        return watcher

    def _unsubscribe(self, watcher: _Watcher) -> None:
        self._progress_watchers.discard(watcher)
        if watcher.trigger is not None:
            by_value = self._triggered.get(watcher.prefix, {})
            group = by_value.get(watcher.trigger)
            if group is not None:
                group.discard(watcher)
                if not group:
                    del by_value[watcher.trigger]
                if not by_value:
                    self._triggered.pop(watcher.prefix, None)
            return
        group = self._watchers.get(watcher.prefix)
        if group is not None:
            group.discard(watcher)
            if not group:
                del self._watchers[watcher.prefix]

    @property
    def watcher_count(self) -> int:
        return sum(len(group) for group in self._watchers.values()) + sum(
            len(g) for by_value in self._triggered.values() for g in by_value.values())

    # --- closing -----------------------------------------------------------

    async def close(self) -> None:
        """Close the file; live watches end (their iterators stop). Idempotent."""
        if self._closed:
            return
        self._closed = True
        for group in [*self._watchers.values(), *(g for b in self._triggered.values() for g in b.values())]:
            for watcher in group:
                watcher.close()
        self._watchers.clear()
        self._triggered.clear()
        self._progress_watchers.clear()
        self._db.close()

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError("the store is closed")
