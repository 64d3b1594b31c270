"""Server-side dry run: where a request says it, and what it may say.

Kubernetes reads ``dryRun`` from two places, and so does this API server:

* the query, for the options a client sends as parameters: create, update, patch
  (``kubectl apply|create|patch --dry-run=server``), and the Eviction's create;
* the body's ``DeleteOptions``: ``kubectl delete --dry-run=server`` sends
  ``{"dryRun": ["All"]}`` in the DELETE's body, and ``kubectl drain --dry-run=server``
  sends it in each Eviction's ``deleteOptions``; nothing in the query says so.

Invariant: a request that says dry run in either place changes nothing - no write, no
move, no deletion - and is answered as if it had (Kubernetes answers so too).  The only
value is ``All``; any other is refused before anything is read or written, with
Kubernetes' wording (422, ``<Kind>Options.meta.k8s.io "" is invalid: dryRun: Unsupported
value: ...``).
"""
from __future__ import annotations

from typing import Any

from aiohttp import web

from . import errors

ALL = "All"


def _unsupported(kind: str, values: list[Any]) -> errors.APIError:
    shown = "[]string{" + ", ".join(f'"{v}"' for v in values) + "}"
    message = f'Unsupported value: {shown}: supported values: "{ALL}"'
    return errors.APIError(422, "Invalid", f'{kind}.meta.k8s.io "" is invalid: dryRun: {message}',
                           details={"kind": kind, "group": "meta.k8s.io",
                                    "causes": [{"reason": "FieldValueNotSupported", "message": message,
                                                "field": "dryRun"}]})


def _says(values: Any, kind: str) -> bool:
    if values is None or values == []:
        return False
    if not isinstance(values, list) or any(v != ALL for v in values):
        raise _unsupported(kind, values if isinstance(values, list) else [values])
    return True


def requested(request: web.Request, options: dict[str, Any] | None = None, *,
              kind: str = "CreateOptions") -> bool:
    """Whether ``request`` is a dry run: ``dryRun=All`` in its query (checked as ``kind``,
    the options type the verb's parameters stand for) or in ``options`` (a decoded
    ``DeleteOptions``, from the body or an Eviction's ``deleteOptions``)."""
    in_query = _says(request.query.getall("dryRun", []), kind)
    in_body = _says((options or {}).get("dryRun"), "DeleteOptions")
    return in_query or in_body
