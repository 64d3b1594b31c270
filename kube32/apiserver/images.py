"""The control plane's module store: embedded images (``kube32.io/wasm-sha256:<hex>``).

``POST /apis/kube32.io/v1/images`` takes a module's bytes (``application/wasm`` or
``application/octet-stream``) and answers its reference, digest, size and exports;
``GET /apis/kube32.io/v1/images/<sha256>`` gives the bytes back to kubelets.

Invariants:

* A stored module is named by the SHA-256 of its bytes
  (``<data-dir>/images/<sha256>.wasm``), so a reference pins its content and a
  second upload of the same bytes is the same image.  Files are written to a
  temporary name and renamed: a reader never sees half a module.
* Only WebAssembly modules are accepted; the exports are read here with the bounded
  section walk of :mod:`kube32.wasmformat` (the API server does not import kube32.wasm:
  layering), on a worker thread, as the module is hashed and written.
  Whether the module follows the pod ABI is the kubelet's judgement.
* Uploads over :data:`MAX_IMAGE_BYTES` are refused with 413 naming the limit.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import tempfile
from pathlib import Path

from aiohttp import web

from .. import wasmformat
from ..terms import API_VERSION, GROUP_PATH, IMAGE_REFERENCE_PREFIX
from . import errors

MAX_IMAGE_BYTES = 8 << 20
REFERENCE_PREFIX = IMAGE_REFERENCE_PREFIX
_SHA = re.compile(r"^[0-9a-f]{64}\Z")
_KINDS = {0: "func", 1: "table", 2: "memory", 3: "global", 4: "tag"}


class ExportParseError(ValueError):
    pass


def module_exports(data: bytes) -> list[dict[str, str]]:
    """The export section as ``[{"name", "kind"}]``; ExportParseError for non-modules
    (:mod:`kube32.wasmformat`'s walk and bounds: unknown or repeated sections, more than
    its limit of exports, a name that is not UTF-8)."""
    try:
        for section in wasmformat.sections(data):
            if section.id == wasmformat.SEC_EXPORT:
                r = wasmformat.Reader(data, section.start, section.end)
                exports = []
                for _ in range(r.count(wasmformat.MAX_EXPORTS, "exports")):
                    name, kind = r.name(), r.byte()
                    r.uleb()
                    exports.append({"name": name, "kind": _KINDS.get(kind, f"kind-{kind}")})
                return exports
        return []
    except wasmformat.FormatError as e:
        raise ExportParseError(str(e)) from None


class ImageStore:
    def __init__(self, directory: Path | None) -> None:
        self._directory = directory   # None: a temporary directory, made at the first upload

    @property
    def directory(self) -> Path:
        if self._directory is None:
            self._directory = Path(tempfile.mkdtemp(prefix="kube32-images-"))
        self._directory.mkdir(parents=True, exist_ok=True)
        return self._directory

    def path(self, sha256: str) -> Path:
        return self.directory / f"{sha256}.wasm"

    def put(self, data: bytes) -> dict:
        try:
            exports = module_exports(data)
        except ExportParseError as e:
            raise errors.bad_request(f"the upload is not a usable WebAssembly module: {e}") from None
        digest = hashlib.sha256(data).hexdigest()
        target = self.path(digest)
        if not target.exists():
            tmp = target.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_bytes(data)
            tmp.replace(target)
        return {"kind": "Image", "apiVersion": API_VERSION, "reference": REFERENCE_PREFIX + digest,
                "sha256": digest, "size": len(data), "exports": exports}

    def exports(self, sha256: str) -> list[str] | None:
        """The export names of a stored image, or None when it is not here."""
        try:
            return [e["name"] for e in module_exports(self.get(sha256))]
        except (errors.APIError, ExportParseError):
            return None

    def get(self, sha256: str) -> bytes:
        if not _SHA.match(sha256):
            raise errors.bad_request("an image is named by its 64 hex digit SHA-256")
        try:
            return self.path(sha256).read_bytes()
        except FileNotFoundError:
            raise errors.APIError(404, "NotFound", f'image "{REFERENCE_PREFIX}{sha256}" is not in the '
                                  "module store (push it with kube32-cli image push)") from None


def add_routes(router: web.UrlDispatcher, store: ImageStore) -> None:
    """Register before the generic ``/apis/{group}/{version}/...`` route."""

    async def upload(request: web.Request) -> web.Response:
        if request.content_length is not None and request.content_length > MAX_IMAGE_BYTES:
            return _too_large()
        data = bytearray()
        async for chunk in request.content.iter_chunked(1 << 16):
            data += chunk
            if len(data) > MAX_IMAGE_BYTES:
                return _too_large()
        return _json(await asyncio.to_thread(store.put, bytes(data)), 201)

    async def download(request: web.Request) -> web.Response:
        data = store.get(request.match_info["sha"])
        return web.Response(body=data, content_type="application/wasm")

    async def info(request: web.Request) -> web.Response:
        """What the control plane knows of an embedded image (its exports: an entry
        point makes it a command pod, which cannot move)."""
        data = store.get(request.match_info["sha"])
        digest = hashlib.sha256(data).hexdigest()
        exports = await asyncio.to_thread(module_exports, data)
        return _json({"kind": "Image", "apiVersion": API_VERSION, "reference": REFERENCE_PREFIX + digest,
                      "sha256": digest, "size": len(data), "exports": [e["name"] for e in exports]}, 200)

    router.add_post(GROUP_PATH + "/images", upload)
    router.add_get(GROUP_PATH + "/images/{sha}", download)
    router.add_get(GROUP_PATH + "/images/{sha}/info", info)


def _too_large() -> web.Response:
    msg = f"the module is larger than the module store's limit of {MAX_IMAGE_BYTES} bytes"
    return _json(errors.APIError(413, "RequestEntityTooLarge", msg).status(), 413,
                         {"Connection": "close"})


def _json(body: object, status: int, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=json.dumps(body).encode(), status=status,
                        content_type="application/json", headers=headers)
