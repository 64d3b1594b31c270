"""Pulling pod images: ``wasm://HOST[:PORT]/PATH`` over HTTP and embedded images
(``kube32.io/wasm-sha256:<hex>``) from the control plane's module store.

Invariants:

* An embedded reference names the digest; a ``wasm://`` image may be pinned by the
  pod annotation ``kube32.io/wasm-sha256``.  The digest is checked where the module
  is loaded (``Runtime.load(expected_sha256=...)``); this module only fetches.
* Module bytes are cached by digest (memory, and ``cache_dir`` on disk), so a pinned
  or embedded image is fetched once per node.  An unpinned ``wasm://`` image is
  fetched again on each pull (its content may change, as a ``latest`` tag does).
  The memory cache holds :data:`MAX_CACHED_BYTES` at most, the last used first kept
  (the disk holds the rest): an image whose host answers new bytes at every pull
  cannot grow the kubelet without bound.
* Failures raise :class:`PullError` with a message fit for a pod's status.
"""
from __future__ import annotations

import hashlib
import re
from collections import OrderedDict
from pathlib import Path

import aiohttp

from ..client import ApiError, Client
from ..movability import embedded_digest
from ..terms import IMAGE_REFERENCE_PREFIX, Annotation
from ..timing import IMAGE_PULL_SECONDS
from ..urlpath import group_path

EMBEDDED_PREFIX = IMAGE_REFERENCE_PREFIX
PIN_ANNOTATION = Annotation.WASM_PIN
MAX_MODULE_BYTES = 64 << 20
MAX_CACHED_BYTES = 64 << 20     # module bytes kept in memory, all digests together
_HEX64 = re.compile(r"^[0-9a-fA-F]{64}$")


class PullError(Exception):
    pass


def expected_digest(image: str, annotations: dict[str, str]) -> str | None:
    """The digest a pod's image must have, when the pod says."""
    embedded = embedded_digest(image)
    if embedded is not None:
        return embedded
    pin = (annotations or {}).get(PIN_ANNOTATION)
    return pin.lower() if pin else None


class ImagePuller:
    def __init__(self, client: Client, cache_dir: Path | None = None) -> None:
        self.client = client
        self.cache_dir = cache_dir
        if cache_dir is not None:
            cache_dir.mkdir(parents=True, exist_ok=True)
        self._cache: OrderedDict[str, bytes] = OrderedDict()   # the last used last
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def cached(self, digest: str) -> bytes | None:
        data = self._cache.get(digest)
        if data is not None:
            self._cache.move_to_end(digest)
        elif self.cache_dir is not None:
            path = self.cache_dir / f"{digest}.wasm"
            if path.exists():
                data = path.read_bytes()
                if hashlib.sha256(data).hexdigest() != digest:
                    path.unlink(missing_ok=True)   # damaged on disk: fetch afresh
                    return None
                self._keep(digest, data)
        return data

    def _keep(self, digest: str, data: bytes) -> None:
        """In the memory cache, the oldest going past :data:`MAX_CACHED_BYTES`."""
        self._cache[digest] = data
        self._cache.move_to_end(digest)
        total = sum(len(d) for d in self._cache.values())
        while total > MAX_CACHED_BYTES and len(self._cache) > 1:
            _, gone = self._cache.popitem(last=False)
            total -= len(gone)

    def _remember(self, data: bytes) -> None:
        digest = hashlib.sha256(data).hexdigest()
        self._keep(digest, data)
        if self.cache_dir is not None:
            path = self.cache_dir / f"{digest}.wasm"
            if not path.exists():
                tmp = path.with_suffix(".tmp")
                tmp.write_bytes(data)
                tmp.replace(path)

    async def pull(self, image: str, annotations: dict[str, str] | None = None) -> bytes:
        want = expected_digest(image, annotations or {})
        if want is not None and not _HEX64.match(want):
            raise PullError(f'image "{image}": the digest must be 64 hex digits')
        if want is not None:
            hit = self.cached(want)
            if hit is not None:
                return hit
        if image.startswith(EMBEDDED_PREFIX):
            data = await self._pull_embedded(want or "")
        elif image.startswith("wasm://"):
            data = await self._pull_http(image)
        else:
            raise PullError(f'image "{image}" is neither wasm://HOST/PATH nor {EMBEDDED_PREFIX}<sha256>')
        # Cache only what matches its pin: a mismatching module must not be served
        # later under the digest it does not have.
        if want is None or hashlib.sha256(data).hexdigest() == want:
            self._remember(data)
        return data

    async def _pull_embedded(self, digest: str) -> bytes:
        try:
            async with self.client.request("GET", group_path("images", digest)) as r:
                if r.status != 200:
                    err = ApiError.from_body(r.status, await r.text())
                    raise PullError(f"cannot pull {EMBEDDED_PREFIX}{digest} from the control plane: {err.message}")
                return await _read_limited(r)
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            raise PullError(f"cannot reach the control plane's module store: {e}") from None

    async def _pull_http(self, image: str) -> bytes:
        url = "http://" + image[len("wasm://"):]
        if self._session is None or self._session.closed:
            timeout = aiohttp.ClientTimeout(total=IMAGE_PULL_SECONDS, sock_connect=10)
            self._session = aiohttp.ClientSession(timeout=timeout)
        try:
            async with self._session.get(url) as r:
                if r.status != 200:
                    raise PullError(f"cannot pull {image}: GET {url} answered {r.status} {r.reason}")
                return await _read_limited(r)
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            raise PullError(f"cannot pull {image}: {type(e).__name__}: {e}") from None


async def _read_limited(r: aiohttp.ClientResponse) -> bytes:
    data = bytearray()
    async for chunk in r.content.iter_chunked(1 << 16):
        data += chunk
        if len(data) > MAX_MODULE_BYTES:
            raise PullError(f"the module is larger than {MAX_MODULE_BYTES} bytes")
    return bytes(data)
