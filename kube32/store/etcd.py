"""EtcdStore: the `Store` protocol on an etcd v3 cluster, as kube-apiserver's storage/etcd3.

Imports grpc and the etcd v3 API stubs of the `aetcd` package (the optional extra
``kube32[etcd]``); nothing else in kube32 imports this module except through
`kube32.store.config.open_store`, so kube32 without etcd never loads grpc.

Mapping onto etcd (one gRPC channel, balanced round-robin over the endpoints):
  keys     the store key k is etcd key ``prefix + k`` (prefix "" by default: the API
           server's keys already begin "/registry/", kube-apiserver's layout). A key
           holding NUL cannot be a store key, so ``prefix + "\\x00compact_rev_key"`` (the
           compactors' shared clock, below) is never listed or watched.
  revision etcd's own: one counter for the whole cluster. `current_revision` is the
           newest revision this client has seen in any answer (another client's writes
           raise it at this client's next call); a fresh cluster starts at 1.
  create   Txn(create_revision(k) = 0) then Put else Range: KeyExists carries the current.
  update   Txn(version(k) > 0 and mod_revision(k) = expected) then Put(prev_kv) else Range
           (the version test keeps "expected 0" from creating a missing key).
  delete   the same with DeleteRange(prev_kv): the deleted KV is the last value at the
           delete's revision.
  list     Range pages of `page_size` keys, every page read at the first page's revision:
           one consistent snapshot however long the list; a compaction between two pages
           starts the list again at the current revision.
  watch    one gRPC Watch stream per watch: start_revision N+1, prev_kv, fragment (a big
           replay comes in pieces under the request limit), progress_notify (an idle watch
           learns newer revisions, so a reconnection does not start from a compacted one).
           When the stream breaks (a member died, the connection reset) the watch resumes
           on another member after the last revision it delivered: no gap, no duplicate.
           etcd's canceled answer with a compact_revision is `Compacted` (the API's 410).
           etcd reads an event's previous value (prev_kv) when it sends the event: one
           whose previous version was compacted before then comes without it, and the
           watch raises Compacted (kube-apiserver's watch errors there too: the client
           lists again). With compaction one interval behind, a live watch never meets it.
  compact  compact(R) = etcd Compact(R): etcd keeps every revision above R and the state
           at R, which is what the protocol promises for "history at or below R dropped".
           `compacted_revision` is the newest compaction this client knows of: its own, one
           etcd reported, one the compactors recorded, and at open the smallest revision
           etcd can still read at (found by bisection with Range at a revision: no write;
           at least 1, the empty revision a cluster begins at).

Compaction is run by the control plane as kube-apiserver's compactor does: every
`compact_interval` seconds (5 minutes by default) each store does a compare-and-swap on
the version of the compactors' key; the one that wins compacts the revision it saw at
its previous tick, so at least one interval of history is kept and several API servers
compact once per interval between them (a compactor that dies is replaced by another's
next tick). Its writes to that key bump the revision, so revisions seen by the API
are not consecutive; nothing relies on them being so.

Availability: every call waits for a reachable member for up to `request_timeout`, in
attempts of `ATTEMPT_TIMEOUT` at most, so a call that sits on a hung member (stopped,
its connection still open) goes on through another (round robin) within seconds. Reads
are retried on UNAVAILABLE, deadlines and etcd's own timeouts (UNKNOWN "context deadline
exceeded" without quorum) within that time. A write is retried too: each is a
compare-and-swap, so a retry never writes twice, and a retry's refusal that shows our
own value (an attempt that timed out had landed) is that write's success; a delete whose
retry finds the key gone fails with `Unavailable` saying its outcome is unknown (the
caller reads again). A call that fails so marks the store down: until a call succeeds,
calls wait `DOWN_TIMEOUT` at most (a client retrying a 503 gets it in seconds).
`health()` is a linearizable read within `HEALTH_TIMEOUT` (a quorum answers): /readyz.

Sizes: etcd refuses a request over its --max-request-bytes (1.5 MiB by default; kube32
starts etcd with `MAX_REQUEST_BYTES`, 4 MiB, over the API's 3 MiB bodies). A value over
`max_value_bytes` is refused before it is sent, and etcd's own refusal (a smaller limit
on an etcd started by someone else) is the same `ValueTooLarge` naming the flag.
Checkpoint data never goes into the store (it stays in the API server's memory).
"""

from __future__ import annotations

import asyncio
import builtins
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from typing import Any

import grpc
from aetcd import rpc

from .base import (
    StoreFigures,
    DELETE,
    PUT,
    Compacted,
    FutureRevision,
    Conflict,
    KeyExists,
    KeyNotFound,
    KeyValue,
    Page,
    StoreError,
    Unavailable,
    ValueTooLarge,
    WatchEvent,
    WatchStream,
    check_key,
    check_prefix,
    check_revision,
    check_value,
)
from .config import MAX_REQUEST_BYTES, grpc_target, parse_endpoints

log = logging.getLogger("kube32.store.etcd")

REQUEST_OVERHEAD = 64 << 10  # room for the key and the transaction around a value
MAX_RECEIVE_BYTES = 512 << 20  # a list page or watch answer: page_size values at most
COMPACT_INTERVAL = 300.0  # kube-apiserver's --etcd-compaction-interval
COMPACT_KEY = "\x00compact_rev_key"
LIST_ATTEMPTS = 5  # a list that a compaction overtakes this often fails with Compacted
RETRY_FIRST, RETRY_MAX = 0.05, 1.0  # backoff between retries of one call, seconds
ATTEMPT_TIMEOUT = 2.0  # one attempt of a retryable call: past it, the call tries another member
DOWN_TIMEOUT = 1.0  # a call's whole wait while the store is known unreachable
HEALTH_TIMEOUT = 2.0  # /readyz's linearizable read
SUSPECT_SECONDS = 10.0  # a member whose attempt failed is tried last this long

_Opened = tuple[grpc.aio.StreamStreamCall, "asyncio.Future[Any]"]
_NOT_PROPOSED = ("no leader", "not capable")  # etcd refused before proposing: safe to retry
# etcd's own timeouts (UNKNOWN on 3.4: "context deadline exceeded" without quorum): retryable
_TRANSIENT = ("context deadline exceeded", "request timed out", "leader changed", "too many requests")


def range_end(prefix: bytes) -> bytes:
    """etcd's exclusive end of the keys starting with `prefix` (b"\\x00": no end)."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\x00"


class EtcdStore(StoreFigures):
    """A `Store` on an etcd v3 cluster; several stores (API servers) may share one cluster."""

    page_size = 100

    def __init__(
        self,
        endpoints: str | Sequence[tuple[str, int]],
        *,
        prefix: str = "",
        request_timeout: float = 10.0,
        compact_interval: float | None = COMPACT_INTERVAL,
        max_value_bytes: int = MAX_REQUEST_BYTES - REQUEST_OVERHEAD,
    ) -> None:
        if prefix and not prefix.endswith("/"):
            raise StoreError(f"an etcd key prefix must end with '/', not {prefix!r}")
        if request_timeout <= 0 or max_value_bytes < 1 or (compact_interval or 1) <= 0:
            raise StoreError("request_timeout, compact_interval and max_value_bytes must be positive")
        self.endpoints = (parse_endpoints(endpoints) if isinstance(endpoints, str)
                          else [(host, int(port)) for host, port in endpoints])
        self._prefix = prefix
        self._prefix_bytes = prefix.encode()
        self._compact_key = (prefix + COMPACT_KEY).encode()
        self._timeout = request_timeout
        self._compact_interval = compact_interval
        self.max_value_bytes = max_value_bytes
        self._revision = 0
        self._compacted = 0
        self._closed = False
        self._down_since: float | None = None  # monotonic time the last call failed Unavailable
        self._watches: set[grpc.aio.StreamStreamCall] = set()
        self._creating: set[asyncio.Future[Any]] = set()  # watches not yet answered by etcd
        self._compactor: asyncio.Task[None] | None = None
        # Watches: one channel balanced over every member (a broken stream resumes on
        # another).  Unary calls: a channel per member, chosen per attempt (`_pick`), so a
        # member that timed out is passed over for `SUSPECT_SECONDS`.
        self._channel = self._open_channel(grpc_target(self.endpoints), balanced=True)
        self._member_channels = [self._open_channel(grpc_target([e]), balanced=False) for e in self.endpoints]
        self._members = [rpc.KVStub(c) for c in self._member_channels]
        self._next_member = 0
        self._suspect: dict[int, float] = {}  # member index -> monotonic time it may be tried again
        self._watch = rpc.WatchStub(self._channel)

    @staticmethod
    def _open_channel(target: str, *, balanced: bool) -> grpc.aio.Channel:
        options: list[tuple[str, Any]] = [
            ("grpc.max_receive_message_length", MAX_RECEIVE_BYTES),
            ("grpc.max_send_message_length", MAX_REQUEST_BYTES + REQUEST_OVERHEAD),
            # A member that vanishes or hangs without closing its connections is noticed
            # (etcd refuses pings more often than its --grpc-keepalive-min-time, 5 s).
            ("grpc.keepalive_time_ms", 6_000),
            ("grpc.keepalive_timeout_ms", 2_000),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 1_000),
        ]
        if balanced:
            options.append(("grpc.lb_policy_name", "round_robin"))
        return grpc.aio.insecure_channel(target, options=options)

    def _pick(self) -> int:
        """The member for the next attempt: the next in turn not suspect (all are: the next)."""
        now, count = time.monotonic(), len(self._members)
        for k in range(count):
            i = (self._next_member + k) % count
            if self._suspect.get(i, 0.0) <= now:
                break
        else:
            i = self._next_member % count
        self._next_member = i + 1
        return i

    @classmethod
    async def open(cls, endpoints: str | Sequence[tuple[str, int]], **options: Any) -> EtcdStore:
        """Connect and learn the current and compacted revisions (Unavailable if no member
        answers within the request timeout)."""
        store = cls(endpoints, **options)
        try:
            await store._start()
        except BaseException:
            await store.close()
            raise
        return store

    async def _start(self) -> None:
        resp = await self._call("Range", rpc.RangeRequest(key=self._compact_key),
                                "reach etcd", idempotent=True)
        if resp.kvs:
            self._compacted = int(resp.kvs[0].value or 0)
        self._compacted = max(self._compacted, await self._find_compacted(resp.header.revision))
        if self._compact_interval:
            self._compactor = asyncio.create_task(self._run_compactor(self._compact_interval))

    async def _find_compacted(self, current: int) -> int:
        """The revision etcd compacted to: the smallest it can still read at, found by
        bisection. At least 1: a cluster begins at revision 1 with nothing in it, so
        "never compacted" and "compacted to 1" are the same history (none)."""
        low, high = 1, max(current, 1)  # readable(high) holds
        if await self._readable_at(low):
            return 1
        while high - low > 1:
            middle = (low + high) // 2
            if await self._readable_at(middle):
                high = middle
            else:
                low = middle
        return high

    async def _readable_at(self, revision: int) -> bool:
        request = rpc.RangeRequest(key=self._compact_key, revision=revision, count_only=True)
        try:
            await self._call("Range", request, "find the compacted revision", idempotent=True)
        except Compacted:
            return False
        return True

    # --- properties --------------------------------------------------------

    @property
    def watcher_count(self) -> int:
        return len(self._watches)

    # --- keys --------------------------------------------------------------

    def _key(self, key: str) -> bytes:
        return (self._prefix + key).encode()

    def _from_etcd(self, kv: Any) -> KeyValue:
        return KeyValue(kv.key[len(self._prefix_bytes):].decode(), kv.value,
                        kv.create_revision, kv.mod_revision)

    def _range(self, prefix: str) -> tuple[bytes, bytes]:
        start = self._key(prefix)
        return (start or b"\x00"), range_end(start)

    @staticmethod
    def _is_store_key(raw: bytes) -> bool:
        return b"\x00" not in raw  # the compactors' key holds a NUL; no store key does

    # --- calls -------------------------------------------------------------

    def _seen(self, header: Any) -> None:
        if header.revision > self._revision:
            self._revision = header.revision

    async def _call(self, method: str, request: Any, what: str, *,
                    idempotent: bool, key: str = "", size: int = 0, timeout: float | None = None,
                    on_retry: Callable[[], None] | None = None) -> Any:
        """One unary call, waiting for a member and retried while that is safe.

        Each attempt has `ATTEMPT_TIMEOUT` at most, so a call that sits on a hung member
        goes on through another (round robin) instead of waiting out the whole deadline;
        a write is retried so only when `on_retry` is given (its caller tells a retry's
        refusal from its own landed attempt). While the store is known unreachable (the
        last call failed so), a call waits `DOWN_TIMEOUT` at most: a client retrying a
        503 gets its answer in seconds, not 10 s a try."""
        self._check_open()
        total = timeout or (self._timeout if self._down_since is None else min(self._timeout, DOWN_TIMEOUT))
        deadline = time.monotonic() + total
        pause = RETRY_FIRST
        while True:
            left = deadline - time.monotonic()
            bounded = idempotent or on_retry is not None
            member = self._pick()
            try:
                # Several members: an unreachable one fails at once (the next is tried);
                # one member: wait for it (a restart).
                resp: Any = await getattr(self._members[member], method)(
                    request, timeout=max(min(left, ATTEMPT_TIMEOUT) if bounded else left, 0.001),
                    wait_for_ready=len(self._members) == 1)
            except grpc.aio.AioRpcError as err:
                self._check_open()
                error = self._error(err, what, key, size)
                if isinstance(error, Unavailable):
                    self._suspect[member] = time.monotonic() + SUSPECT_SECONDS
                retry = isinstance(error, Unavailable) and (
                    bounded or any(s in (err.details() or "") for s in _NOT_PROPOSED))
                if not retry or time.monotonic() + pause >= deadline:
                    if isinstance(error, Unavailable) and timeout is None:
                        self._down_since = self._down_since or time.monotonic()
                    raise error from None
                if on_retry is not None:
                    on_retry()
                await asyncio.sleep(pause)
                pause = min(pause * 2, RETRY_MAX)
                continue
            self._down_since = None
            self._suspect.pop(member, None)
            self._seen(resp.header)
            return resp

    async def health(self) -> str | None:
        """None when etcd serves a linearizable read (a quorum) within `HEALTH_TIMEOUT`;
        otherwise why not (for /readyz)."""
        if self._closed:
            return "the store is closed"
        try:
            await self._call("Range", rpc.RangeRequest(key=self._compact_key, count_only=True),
                             "read from etcd (health check)", idempotent=True, timeout=HEALTH_TIMEOUT)
        except StoreError as e:
            return str(e)
        return None

    def _error(self, err: grpc.aio.AioRpcError, what: str, key: str = "", size: int = 0) -> StoreError:
        code, details = err.code(), err.details() or ""
        if "required revision has been compacted" in details:
            return Compacted(self._compacted)
        if "required revision is a future revision" in details:
            return FutureRevision(0, self._revision)
        if "request is too large" in details or code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            # etcd does not say its limit: only that this request was over it.
            return ValueTooLarge(key, size, None,
                                 f"etcd refused it: {details}; raise etcd's --max-request-bytes "
                                 f"(1.5 MiB by default; kube32 starts its etcd with {MAX_REQUEST_BYTES}) "
                                 f"or store less")
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) or (
                code == grpc.StatusCode.UNKNOWN and any(t in details for t in _TRANSIENT)):
            where = ", ".join(f"{h}:{p}" for h, p in self.endpoints)
            return Unavailable(f"cannot {what}: etcd at {where} did not answer in time, no quorum or no "
                               f"member reachable ({code.name}: {details})")
        return StoreError(f"cannot {what}: etcd answered {code.name}: {details}")

    # --- reads -------------------------------------------------------------

    async def get(self, key: str) -> KeyValue | None:
        key = check_key(key)
        resp = await self._call("Range", rpc.RangeRequest(key=self._key(key)),
                                f"read key {key!r}", idempotent=True)
        return self._from_etcd(resp.kvs[0]) if resp.kvs else None

    async def list(self, prefix: str) -> tuple[list[KeyValue], int]:
        prefix = check_prefix(prefix)
        self._check_open()
        for _ in range(LIST_ATTEMPTS - 1):
            try:
                return await self._list_once(prefix)
            except Compacted:
                continue  # compacted between two pages: read it all again, now
        return await self._list_once(prefix)

    async def _list_once(self, prefix: str) -> tuple[builtins.list[KeyValue], int]:
        start, end = self._range(prefix)
        items: list[KeyValue] = []
        revision = 0
        while True:
            request = rpc.RangeRequest(key=start, range_end=end, limit=self.page_size,
                                       revision=revision)
            resp = await self._call("Range", request, f"list prefix {prefix!r}",
                                    idempotent=True)
            revision = revision or resp.header.revision
            items += [self._from_etcd(kv) for kv in resp.kvs if self._is_store_key(kv.key)]
            if not resp.more or not resp.kvs:
                return items, revision
            start = resp.kvs[-1].key + b"\x00"

    async def page(self, prefix: str, *, after: str = "", limit: int = 0, revision: int = 0,
                   count: bool = True) -> Page:
        """See Store.page: Range from just after `after`, at `revision` (etcd's own MVCC
        read), in pieces of at most `page_size` keys all read at the first one's revision."""
        prefix = check_prefix(prefix)
        limit = check_revision(limit, "the page limit")
        revision = check_revision(revision, "the page revision")
        if not isinstance(after, str):
            raise StoreError(f"a page's start must be a key, not {after!r}")
        self._check_open()
        if revision and revision < self._compacted:
            raise Compacted(self._compacted, revision)
        start, end = self._range(prefix)
        if after:
            start = max(start, self._key(after) + b"\x00")
        items: list[KeyValue] = []
        try:
            while True:
                want = self.page_size if not limit else min(self.page_size, limit - len(items))
                request = rpc.RangeRequest(key=start, range_end=end, limit=want, revision=revision)
                resp = await self._call("Range", request, f"list prefix {prefix!r}", idempotent=True)
                revision = revision or resp.header.revision
                items += [self._from_etcd(kv) for kv in resp.kvs if self._is_store_key(kv.key)]
                remaining = max(0, resp.count - len(resp.kvs))
                if not resp.more or not resp.kvs or (limit and len(items) >= limit):
                    return Page(items, revision, remaining)
                start = resp.kvs[-1].key + b"\x00"
        except FutureRevision:
            raise FutureRevision(revision, self._revision) from None
        except Compacted as err:
            raise Compacted(max(err.compacted_revision, self._compacted), revision) from None

    # --- writes ------------------------------------------------------------

    def _value(self, key: str, value: object) -> bytes:
        value = check_value(value)
        if len(value) > self.max_value_bytes:
            raise ValueTooLarge(key, len(value), self.max_value_bytes)
        return value

    async def _txn(self, key: str, compare: builtins.list[Any], success: Any, what: str,
                   size: int = 0) -> tuple[Any, bool]:
        """The transaction's answer, and whether it was sent more than once (an attempt
        that timed out may have landed: then the retry's refusal shows our own write).
        Every write is a compare-and-swap, so a retry never writes twice."""
        raw = self._key(key)
        request = rpc.TxnRequest(
            compare=compare, success=[success],
            failure=[rpc.RequestOp(request_range=rpc.RangeRequest(key=raw))])
        tries = []
        resp = await self._call("Txn", request, what, idempotent=False, key=key, size=size,
                                on_retry=lambda: tries.append(1))
        return resp, bool(tries)

    def _exists(self, raw: bytes) -> Any:
        return rpc.Compare(result=rpc.Compare.GREATER, target=rpc.Compare.VERSION, key=raw, version=0)

    def _write_compares(self, key: str, expected_mod_revision: int | None) -> builtins.list[Any]:
        raw = self._key(key)
        compares = [self._exists(raw)]
        if expected_mod_revision is not None:
            check_revision(expected_mod_revision, "expected_mod_revision")
            compares.append(rpc.Compare(result=rpc.Compare.EQUAL, target=rpc.Compare.MOD,
                                        key=raw, mod_revision=expected_mod_revision))
        return compares

    def _refusal(self, key: str, resp: Any, expected: int | None) -> StoreError:
        kvs = resp.responses[0].response_range.kvs
        if not kvs:
            return KeyNotFound(key)
        return Conflict(self._from_etcd(kvs[0]), expected)

    async def create(self, key: str, value: bytes) -> KeyValue:
        key = check_key(key)
        value = self._value(key, value)
        raw = self._key(key)
        absent = rpc.Compare(result=rpc.Compare.EQUAL, target=rpc.Compare.CREATE, key=raw,
                             create_revision=0)
        put = rpc.RequestOp(request_put=rpc.PutRequest(key=raw, value=value))
        resp, retried = await self._txn(key, [absent], put, f"write key {key!r}", len(value))
        if not resp.succeeded:
            kvs = resp.responses[0].response_range.kvs
            current = self._from_etcd(kvs[0]) if kvs else None
            if retried and current is not None and current.value == value:
                return current  # an attempt that timed out had landed
            raise KeyExists(key, current)
        revision = resp.header.revision
        return KeyValue(key, value, revision, revision)

    async def update(self, key: str, value: bytes, expected_mod_revision: int | None) -> KeyValue:
        """Replace `key`'s value if its mod_revision is `expected_mod_revision` (None: any)."""
        key = check_key(key)
        value = self._value(key, value)
        compares = self._write_compares(key, expected_mod_revision)
        put = rpc.RequestOp(request_put=rpc.PutRequest(key=self._key(key), value=value, prev_kv=True))
        resp, retried = await self._txn(key, compares, put, f"write key {key!r}", len(value))
        if not resp.succeeded:
            refusal = self._refusal(key, resp, expected_mod_revision)
            if retried and isinstance(refusal, Conflict) and refusal.current.value == value:
                return refusal.current  # an attempt that timed out had landed
            raise refusal
        prev = resp.responses[0].response_put.prev_kv
        return KeyValue(key, value, prev.create_revision, resp.header.revision)

    async def delete(self, key: str, expected_mod_revision: int | None = None) -> KeyValue:
        key = check_key(key)
        compares = self._write_compares(key, expected_mod_revision)
        remove = rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(
            key=self._key(key), prev_kv=True))
        resp, retried = await self._txn(key, compares, remove, f"delete key {key!r}")
        if not resp.succeeded:
            refusal = self._refusal(key, resp, expected_mod_revision)
            if retried and isinstance(refusal, KeyNotFound):
                raise Unavailable(f"cannot delete key {key!r}: an attempt timed out and the key is gone now; "
                                  "whether that attempt deleted it is unknown")
            raise refusal
        (prev,) = resp.responses[0].response_delete_range.prev_kvs
        return KeyValue(key, prev.value, prev.create_revision, resp.header.revision)

    # --- compaction --------------------------------------------------------

    async def compact(self, revision: int) -> None:
        """Drop history at or below `revision`; a no-op if already compacted that far."""
        self._check_open()
        check_revision(revision, "the compaction revision")
        if revision <= self._compacted:
            return
        if self._creating:  # watches opened before this call are in etcd before it compacts
            await asyncio.wait(set(self._creating), timeout=self._timeout)
        try:
            await self._call("Compact", rpc.CompactionRequest(revision=revision),
                             f"compact to revision {revision}", idempotent=True)
        except Compacted:
            pass  # someone compacted further already
        except StoreError as err:
            if isinstance(err, FutureRevision) or "future revision" in str(err):
                raise StoreError(f"cannot compact to revision {revision}: the current "
                                 f"revision is {self._revision}") from None
            raise
        self._learn_compacted(revision)

    def _learn_compacted(self, revision: int) -> None:
        if revision > self._compacted:
            self._compacted = revision

    async def _run_compactor(self, interval: float) -> None:
        """kube-apiserver's compactor (storage/etcd3/compact.go): see the module docstring."""
        clock, revision = 0, 0
        while True:
            await asyncio.sleep(interval)
            try:
                clock, revision = await self._compact_tick(clock, revision)
            except StoreError as err:
                log.warning("etcd compaction failed (tried again in %gs): %s", interval, err)

    async def _compact_tick(self, clock: int, revision: int) -> tuple[int, int]:
        """One compactor round: (the compactors' clock now, the revision to compact next)."""
        ours = rpc.Compare(result=rpc.Compare.EQUAL, target=rpc.Compare.VERSION,
                           key=self._compact_key, version=clock)
        put = rpc.RequestOp(request_put=rpc.PutRequest(key=self._compact_key,
                                                       value=str(revision).encode()))
        request = rpc.TxnRequest(compare=[ours], success=[put], failure=[
            rpc.RequestOp(request_range=rpc.RangeRequest(key=self._compact_key))])
        resp = await self._call("Txn", request, "take the compactors' turn",
                                idempotent=False)
        now = resp.header.revision
        if not resp.succeeded:
            (theirs,) = resp.responses[0].response_range.kvs
            self._learn_compacted(int(theirs.value or 0))
            return theirs.version, now
        if revision:
            await self.compact(revision)
            log.info("etcd compacted to revision %d", revision)
        return clock + 1, now

    # --- watch -------------------------------------------------------------

    def watch(self, prefix: str, start_revision: int) -> WatchStream:
        """Events with revision > start_revision under `prefix`: replayed, then live.

        0 means "from now": after the newest revision this client has seen when watch()
        is called (see the module docstring). The first stream opens at this call, so a
        watch from now is live in etcd before the caller's next write or compaction.
        """
        now = self._revision
        opened = None
        if not self._closed and isinstance(prefix, str) and isinstance(start_revision, int):
            cursor = start_revision or now
            if cursor >= 0 and (start_revision == 0 or cursor >= self._compacted):
                opened = self._open_stream(prefix, cursor)

        def release() -> None:
            if opened is not None:
                self._close_stream(opened[0])

        return WatchStream(self._stream(prefix, start_revision, now, opened), release)

    def _open_stream(self, prefix: str, cursor: int) -> _Opened:
        """A Watch stream for events after `cursor`, and its create request on its way: the
        future is etcd's first answer (normally "created").  compact() waits for these, so
        a watch this client opened is in etcd before this client's compaction is."""
        key, end = self._range(prefix)
        call = self._watch.Watch(wait_for_ready=True)
        self._watches.add(call)
        request = rpc.WatchRequest(create_request=rpc.WatchCreateRequest(
            key=key, range_end=end, start_revision=cursor + 1, prev_kv=True,
            fragment=True, progress_notify=True))

        async def create() -> Any:
            await call.write(request)
            return await call.read()
        created = asyncio.ensure_future(create())
        self._creating.add(created)
        created.add_done_callback(self._creating.discard)
        created.add_done_callback(lambda t: t.cancelled() or t.exception())
        return call, created

    @staticmethod
    async def _responses(call: grpc.aio.StreamStreamCall, created: asyncio.Future[Any]) -> AsyncIterator[Any]:
        resp = await created
        while resp is not grpc.aio.EOF:
            yield resp
            resp = await call.read()

    async def _stream(self, prefix: str, start: int, now: int,
                      opened: _Opened | None) -> AsyncGenerator[WatchEvent, None]:
        try:
            if self._closed:
                return
            prefix = check_prefix(prefix)
            cursor = check_revision(start, "start_revision") or now
            if start != 0 and cursor < self._compacted:
                raise Compacted(self._compacted, cursor)
            pause = RETRY_FIRST
            while not self._closed:
                call, created = opened or self._open_stream(prefix, cursor)
                opened = None
                try:
                    async for resp in self._responses(call, created):
                        pause = RETRY_FIRST  # a member answered: the next break retries at once
                        events, cursor = self._read_response(resp, cursor)
                        for event in events:
                            yield event
                except asyncio.CancelledError:
                    task = asyncio.current_task()
                    if task is not None and task.cancelling():
                        raise  # our reader is cancelled
                    return  # close() or aclose() cancelled the stream: the watch ends
                except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as err:
                    if self._closed or call.cancelled():
                        return
                    if isinstance(err, grpc.aio.AioRpcError):
                        error = self._error(err, f"watch prefix {prefix!r}")
                        if not isinstance(error, Unavailable):
                            raise error from None
                    log.info("etcd watch of %r broke (%s); resuming after revision %d",
                             prefix, err, cursor)
                finally:
                    self._close_stream(call)
                if not self._closed:
                    await asyncio.sleep(pause)  # the stream ended or broke: resume elsewhere
                    pause = min(pause * 2, RETRY_MAX)
        finally:
            if opened is not None:
                self._close_stream(opened[0])

    def _read_response(self, resp: Any, cursor: int) -> tuple[builtins.list[WatchEvent], int]:
        """A watch response's events past `cursor` under the store's keys, and the new cursor."""
        self._seen(resp.header)
        if resp.canceled:
            raise self._watch_refusal(resp, cursor)
        if not (resp.events or resp.created or resp.fragment):
            return [], max(cursor, resp.header.revision)  # progress, nothing for us
        events = []
        for ev in resp.events:
            if ev.kv.mod_revision > cursor and self._is_store_key(ev.kv.key):
                events.append(self._event(ev, cursor))
            cursor = max(cursor, ev.kv.mod_revision)
        return events, cursor

    def _close_stream(self, call: grpc.aio.StreamStreamCall) -> None:
        self._watches.discard(call)
        call.cancel()

    def _watch_refusal(self, resp: Any, cursor: int) -> StoreError:
        if resp.compact_revision:
            self._learn_compacted(resp.compact_revision)
            return Compacted(max(resp.compact_revision, self._compacted), cursor)
        return StoreError(f"etcd cancelled the watch: {resp.cancel_reason or 'no reason given'}")

    def _event(self, ev: Any, cursor: int) -> WatchEvent:
        kv = ev.kv
        prev = self._from_etcd(ev.prev_kv) if ev.HasField("prev_kv") else None
        if prev is None and (ev.type == rpc.Event.DELETE or kv.version > 1):
            # etcd no longer has the value before this event: that history is gone.
            raise Compacted(max(self._compacted, kv.mod_revision - 1), cursor)
        if ev.type == rpc.Event.DELETE:
            assert prev is not None
            gone = KeyValue(prev.key, prev.value, prev.create_revision, kv.mod_revision)
            return WatchEvent(DELETE, gone, prev, kv.mod_revision)
        return WatchEvent(PUT, self._from_etcd(kv), prev if kv.version > 1 else None,
                          kv.mod_revision)

    # --- closing -----------------------------------------------------------

    async def close(self) -> None:
        """Close the channel; live watches end (their iterators stop). Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._compactor is not None:
            self._compactor.cancel()
        for call in list(self._watches):
            call.cancel()
        await self._channel.close()
        for channel in self._member_channels:
            await channel.close()

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError("the store is closed")

