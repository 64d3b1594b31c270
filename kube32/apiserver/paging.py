"""Lists as kube-apiserver serves them: ``limit`` and ``continue`` pages, the
``resourceVersion`` / ``resourceVersionMatch`` semantics, and streamed list bodies.

Design: a list reads the store a page at a time (:meth:`Store.page`) at one revision,
decodes and filters each object, and hands it on with a turn of the event loop after
every ``TURN_BYTES`` of stored objects (and after each big one), so neither a long list
nor a list of big objects holds the loop that answers
``/healthz`` and node Lease renewals.  The server writes each object as it comes
(:func:`stream_list`): nothing holds the whole list, decoded or encoded.

Continue tokens are kube-apiserver's: base64url of ``{"v": "meta.k8s.io/v1", "rv": R,
"start": K}``, K the last key served relative to the list's store prefix.  Invariants:

* Every page of one list is read at the first page's revision R: the pages together are
  exactly the state at R (the store's page invariant), whatever is written meanwhile.
* A token is validated before anything is read: not base64 JSON of that shape, a
  revision that is not a positive integer, or a key that leaves the prefix (``..``,
  a leading ``/``, NUL) is 400 naming the cause; a token's rev may also be -1 (what an
  Expired answer hands out: "continue from the current state", inconsistent).
* A token whose revision was compacted is 410 Expired, with a message that says to
  start a fresh list and, in ``metadata.continue``, an inconsistent token that goes on
  at the current state from the same key (kube-apiserver's answer).
* ``metadata.remainingItemCount`` is set on a page that is not the last when the list
  has no selector (with one, how many remaining items match is unknown, as in
  kube-apiserver); ``metadata.continue`` only when more items follow.
* resourceVersion semantics (kube-apiserver's): unset: the current state;
  ``"0"``: any (the current state); N with ``resourceVersionMatch=NotOlderThan`` (or
  unset match and no limit): a state at least as new as N; N with ``Exact`` (or unset
  match with a limit, the legacy reading): exactly N, 410 when N is compacted; a
  revision the store has not reached is 504 "Too large resource version".
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Mapping

from ..store import Compacted, FutureRevision, KeyValue, Store
from . import errors

TOKEN_VERSION = "meta.k8s.io/v1"
MAX_TOKEN = 4096            # characters of a continue token
CHUNK = 64                  # store keys read at a time by a list without a limit (or with a selector)
# Stored bytes a list decodes, filters and encodes between two turns of the event loop:
# a turn per object cost more than the object (a loop iteration per 1 KB pod), and this
# much JSON is well under a millisecond of work, so no list holds the loop longer.
TURN_BYTES = 64 << 10
EXACT, NOT_OLDER_THAN = "Exact", "NotOlderThan"

Obj = dict[str, Any]

EXPIRED_TOKEN = ("The provided continue parameter is too old to display a consistent list result. You can "
                 "start a new list without the continue parameter, or use the continue token in this response "
                 "to retrieve the remainder of the results. Continuing with the provided token results in an "
                 "inconsistent list - objects that were created, modified, or deleted between the time the "
                 "first chunk was returned and now may show up in the list.")


class Expired(errors.APIError):
    """410 Expired whose Status carries a token to go on with (``metadata.continue``)."""

    def __init__(self, message: str, token: str = "") -> None:
        super().__init__(410, "Expired", message)
        self.token = token

    def status(self) -> dict[str, Any]:
        body = super().status()
        if self.token:
            body["metadata"] = {"continue": self.token}
        return body


def too_large(wanted: int, current: int) -> errors.APIError:
    """kube-apiserver's answer to a read at a revision it has not reached."""
    return errors.APIError(504, "Timeout", f"Too large resource version: {wanted}, current: {current}",
                           details={"causes": [{"reason": "ResourceVersionTooLarge",
                                                "message": "Too large resource version"}],
                                    "retryAfterSeconds": 1},
                           headers={"Retry-After": "1"})   # client-go's retry reads the header


# --- continue tokens -----------------------------------------------------------------
def encode_token(prefix: str, revision: int, last_key: str) -> str:
    if not last_key.startswith(prefix):
        raise ValueError(f"key {last_key!r} is not under {prefix!r}")
    doc = {"v": TOKEN_VERSION, "rv": revision, "start": last_key[len(prefix):]}
    return base64.urlsafe_b64encode(json.dumps(doc, separators=(",", ":")).encode()).decode().rstrip("=")


def decode_token(token: str, prefix: str) -> tuple[int, str]:
    """(revision, last store key) of a token; 400 naming what is wrong with it.  The
    revision is -1 for an inconsistent continuation (read the current state)."""
    def invalid(why: str) -> errors.APIError:
        return errors.bad_request(f"continue key is not valid: {why}")

    if len(token) > MAX_TOKEN:
        raise invalid(f"longer than {MAX_TOKEN} characters")
    try:
        doc = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    except (binascii.Error, ValueError):
        raise invalid("not a token this server handed out (not base64-encoded JSON)") from None
    if not isinstance(doc, dict) or doc.get("v") != TOKEN_VERSION:
        raise invalid(f'its version is not "{TOKEN_VERSION}"')
    rv, start = doc.get("rv"), doc.get("start")
    if isinstance(rv, bool) or not isinstance(rv, int) or (rv <= 0 and rv != -1):
        raise invalid("its resource version is not a positive integer")
    if not isinstance(start, str) or not start:
        raise invalid("it names no key to continue from")
    if start.startswith("/") or "\x00" in start or ".." in start.split("/"):
        raise invalid("its key does not stay within the list's resource")
    return rv, prefix + start


# --- the options of a list -------------------------------------------------------------
@dataclass(frozen=True)
class ListOptions:
    limit: int = 0          # 0: no limit
    after: str = ""         # store key the list goes on after ("" from the start)
    revision: int = 0       # read exactly at this revision (0: the current state)
    not_older_than: int = 0  # the state read must be at least this new
    continued: bool = False


def parse_limit(query: Mapping[str, str]) -> int:
    raw = query.get("limit") or "0"
    try:
        limit = int(raw)
    except ValueError:
        raise errors.bad_request(f'limit must be a non-negative integer, not "{raw}"') from None
    if limit < 0:
        raise errors.bad_request(f"limit must be a non-negative integer, not {limit}")
    return limit


def parse_revision(raw: str) -> int:
    try:
        rv = int(raw)
    except ValueError:
        rv = -1
    if rv < 0:
        raise errors.bad_request(f'invalid resource version: "{raw}": must be a non-negative integer')
    return rv


def parse_match(query: Mapping[str, str]) -> str:
    match = query.get("resourceVersionMatch") or ""
    if match not in ("", EXACT, NOT_OLDER_THAN):
        raise errors.bad_request(f'resourceVersionMatch: Unsupported value: "{match}": supported values: '
                                 f'"{EXACT}", "{NOT_OLDER_THAN}"')
    if match and not query.get("resourceVersion"):
        raise errors.bad_request("resourceVersionMatch is forbidden unless resourceVersion is provided")
    return match


def list_options(query: Mapping[str, str], prefix: str) -> ListOptions:
    """A list request's options, or 400 naming the parameter at fault."""
    limit = parse_limit(query)
    raw_rv = query.get("resourceVersion") or ""
    token = query.get("continue") or ""
    if token:
        if raw_rv:
            raise errors.bad_request("specifying resource version is not allowed when using continue")
        if query.get("resourceVersionMatch"):
            raise errors.bad_request("specifying resource version match is not allowed when using continue")
        rv, after = decode_token(token, prefix)
        return ListOptions(limit, after, max(rv, 0), continued=True)
    match = parse_match(query)
    rv = parse_revision(raw_rv) if raw_rv else 0
    if match == EXACT:
        if rv == 0:
            raise errors.bad_request('resourceVersionMatch "Exact" is forbidden for resourceVersion "0"')
        return ListOptions(limit, revision=rv)
    if match == NOT_OLDER_THAN or not limit:
        return ListOptions(limit, not_older_than=rv)
    return ListOptions(limit, revision=rv)  # a revision and a limit, no match: Exact (legacy)


# --- reading a list --------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Item:
    """One object of a list: its stored version, and the object decoded (None when the
    list needed no decoding: no selector, and the caller sends the stored bytes)."""

    kv: KeyValue
    object: Obj | None


class Listing:
    """One list: :meth:`open` reads its first page (every refusal comes then, before an
    answer is begun); iterating yields its items (:class:`Item`), and afterwards ``revision``,
    ``token`` ("" on the last page) and ``remaining`` (None: unknown) describe it.
    ``decoded``: decode every object (else only those a selector must look at).
    ``token_prefix``: the prefix continue tokens are relative to (the list's resource's and
    namespace's, as :func:`list_options` reads them), when ``prefix``, what is read, is
    narrower (one name's keys: a ``metadata.name`` selector)."""

    def __init__(self, store: Store, prefix: str, options: ListOptions,
                 decode: Callable[[KeyValue], Obj], keep: Callable[[Obj], bool] | None,
                 decoded: bool = True, token_prefix: str | None = None) -> None:
        self.store, self.prefix, self.options = store, prefix, options
        self.token_prefix = token_prefix if token_prefix is not None else prefix
        self.decode, self.keep, self.decoded = decode, keep, decoded
        self.revision = 0
        self.token = ""
        self.remaining: int | None = None
        self._first: Any = None

    def _size(self, taken: int) -> int:
        limit = self.options.limit
        return limit - taken if limit and self.keep is None else CHUNK

    async def _page(self, after: str, revision: int, taken: int) -> Any:
        try:
            # The count of what follows a page is asked only where the answer names it
            # (remainingItemCount: a client's limit, no selector); a chunk of a list needs
            # none, and counting the rest of the range after every chunk made a list O(n^2).
            return await self.store.page(self.prefix, after=after, limit=self._size(taken), revision=revision,
                                         count=bool(self.options.limit) and self.keep is None)
        except Compacted as e:
            if self.options.continued:
                fresh = encode_token(self.token_prefix, -1, after)
                raise Expired(EXPIRED_TOKEN, fresh) from None
            raise Expired(f"The resourceVersion for the provided list is too old: {revision} "
                          f"(history before {e.compacted_revision} is compacted); list again without it") from None
        except FutureRevision as e:
            raise too_large(revision, e.current_revision) from None

    async def open(self) -> Listing:
        o = self.options
        self._first = await self._page(o.after, o.revision, 0)
        self.revision = self._first.revision
        if self.revision < o.not_older_than:
            raise too_large(o.not_older_than, self.revision)
        return self

    async def __aiter__(self) -> AsyncIterator[Item]:
        page, taken, limit = self._first, 0, self.options.limit
        since_turn = 0
        while page.items:
            for i, kv in enumerate(page.items):
                obj = self.decode(kv) if self.decoded or self.keep is not None else None
                since_turn += len(kv.value)
                if since_turn >= TURN_BYTES:   # the loop serves others between
                    since_turn = 0
                    await asyncio.sleep(0)
                if self.keep is not None and obj is not None and not self.keep(obj):
                    continue
                yield Item(kv, obj)
                taken += 1
                if limit and taken >= limit:
                    self._stopped_at(kv.key, len(page.items) - i - 1 + page.remaining)
                    return
            if not page.remaining:
                return
            page = await self._page(page.items[-1].key, self.revision, taken)

    def _stopped_at(self, key: str, left: int) -> None:
        if left:
            self.token = encode_token(self.token_prefix, self.revision, key)
            self.remaining = left if self.keep is None else None

    def metadata(self) -> Obj:
        md: Obj = {"resourceVersion": str(self.revision)}
        if self.token:
            md["continue"] = self.token
            if self.remaining is not None:
                md["remainingItemCount"] = self.remaining
        return md


# --- the answer ------------------------------------------------------------------------
def dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


async def encoded_list(head: Obj, field: str, items: AsyncIterator[bytes],
                       tail: Callable[[], Obj]) -> AsyncIterator[bytes]:
    """A list's JSON in pieces: ``head``'s fields, then ``field`` as an array of the
    encoded ``items``, then ``tail()``'s fields (read after the last item: a list's
    metadata is known only then; JSON's fields have no order)."""
    yield dumps(head)[:-1] + f',"{field}":['.encode()
    first = True
    async for item in items:
        if not first:
            yield b","   # a piece of its own: the item's bytes are not copied to prepend it
        yield item
        first = False
    rest = dumps(tail())
    yield b"]" + (b"," + rest[1:] if rest != b"{}" else b"}")


# --- the options of a watch ------------------------------------------------------------
@dataclass(frozen=True)
class WatchOptions:
    bookmarks: bool = False       # allowWatchBookmarks
    initial: bool = False         # begin with an ADDED per object (the state at the start)
    initial_end_mark: bool = False  # sendInitialEvents=true: a BOOKMARK ends the initial events
    start: int = 0                # not initial: events after this revision (0: from now)
    not_older_than: int = 0       # initial: the state read must be at least this new


def watch_options(query: Mapping[str, str], flag: Callable[[Mapping[str, str], str], bool]) -> WatchOptions:
    """A watch request's options as kube-apiserver validates them; ``flag`` reads a boolean
    parameter (routing.query_flag)."""
    bookmarks = flag(query, "allowWatchBookmarks")
    match = query.get("resourceVersionMatch") or ""
    if match not in ("", EXACT, NOT_OLDER_THAN):
        raise errors.bad_request(f'resourceVersionMatch: Unsupported value: "{match}": supported values: '
                                 f'"{EXACT}", "{NOT_OLDER_THAN}"')
    raw_rv = query.get("resourceVersion") or ""
    rv = parse_revision(raw_rv) if raw_rv else 0
    if "sendInitialEvents" not in query:
        if match:
            raise errors.bad_request("resourceVersionMatch is forbidden for watch unless sendInitialEvents "
                                     "is provided")
        initial = raw_rv in ("", "0")
        return WatchOptions(bookmarks, initial, start=0 if initial else rv)
    if match != NOT_OLDER_THAN:
        raise errors.bad_request(f'sendInitialEvents requires setting resourceVersionMatch to "{NOT_OLDER_THAN}"')
    if not bookmarks:
        raise errors.bad_request("allowWatchBookmarks must be set to true when sendInitialEvents is set")
    if flag(query, "sendInitialEvents"):
        return WatchOptions(bookmarks, True, True, not_older_than=rv)
    return WatchOptions(bookmarks, False, start=rv)
