"""How much one request may make the API server hold or do: the bounds every decoder,
patch and write keeps (kube-apiserver's numbers where it has one).

* ``MAX_BODY``: bytes of a request body (kube-apiserver's ``MaxRequestBodyBytes``).
  A larger one is a 413 before it is read whole.
* ``MAX_DECODED``: estimated bytes of a decoded body as JSON, every YAML alias and
  merge key expanded: aliases cannot make a body bigger than a body may be.
* ``MAX_DEPTH``: nesting levels of objects and arrays in a decoded body (and what a
  JSON patch may build).  kube-apiserver's Go decoders stop at 10000; Kube32's are
  Python, whose copy, compare and encode recurse, so the bound is lower, and still far
  above any Kubernetes object (a Deployment's deepest field is about 12 levels down).
* ``MAX_VALUES``: values (objects, arrays, strings, numbers, ...) in a decoded body or a
  stored object.  A Kubernetes object near the size limit holds its bulk in strings;
  a body of 3 MiB of ``1,1,1,...`` is 1.5 million values, and each pass over it
  (copy, validate, encode) would hold the event loop for a quarter of a second.
  With this bound no pass over one object costs more than a few tens of milliseconds.
* ``MAX_OBJECT``: bytes of an object's stored JSON.  What the server keeps can always
  be sent back as a body, and no write can grow an object without bound patch after
  patch (each later read, copy and patch of it would cost more).
* :func:`out_of_range`: a number no JSON value may be.  JSON has no NaN or infinity,
  and Kubernetes' Go decoders read a number into a 64-bit integer or float: one past
  a float's range (``1e999``, a 400-digit integer) fails every Go client that reads
  the object back (kubectl: "invalid character 'I'" for Python's ``Infinity``).
* ``MAX_REQUEST_LINE``: bytes of a request line (method, path and query).  Go's HTTP
  server, kube-apiserver's, takes 1 MiB of request line and headers; aiohttp's 8190 made
  a long field selector (500 terms) a plain-text 400 from the HTTP layer (round 25d).
* ``MAX_JSON_PATCH_OPERATIONS`` and ``JSON_PATCH_MAX_COPY_BYTES``: kube-apiserver's
  ``maxJSONPatchOperations`` and ``JSONPatchMaxCopyBytes`` (the size a JSON patch's
  ``copy`` operations may add, together).
"""
from __future__ import annotations

import math

MAX_BODY = 3 * 1024 * 1024
MAX_REQUEST_LINE = 1 << 20
MAX_DECODED = MAX_BODY
MAX_DEPTH = 100
MAX_VALUES = 200_000
MAX_OBJECT = MAX_BODY
MAX_JSON_PATCH_OPERATIONS = 10000
JSON_PATCH_MAX_COPY_BYTES = MAX_BODY


def out_of_range(number: int | float) -> bool:
    """NaN, an infinity, or a number beyond a 64-bit float's range (see above)."""
    if isinstance(number, float):
        return not math.isfinite(number)
    try:
        float(number)
    except OverflowError:
        return True
    return False
