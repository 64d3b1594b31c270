"""Kubernetes ``Status`` errors.

Every refusal of the API server is an :class:`APIError` that renders as a
``meta/v1 Status`` whose ``code`` equals the HTTP status, as kubectl expects
(it prints ``Error from server (<reason>): <message>``).  Handlers raise; one
middleware renders, so no handler builds error bodies by hand.
"""
from __future__ import annotations

from typing import Any


class APIError(Exception):
    """A refusal with a Kubernetes reason, HTTP code and message."""

    def __init__(self, code: int, reason: str, message: str, *,
                 details: dict[str, Any] | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details
        self.headers = headers or {}

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": self.message,
            "reason": self.reason, "code": self.code,
        }
        if self.details:
            body["details"] = self.details
        return body


def _details(kind: str, name: str | None, group: str = "") -> dict[str, Any]:
    d: dict[str, Any] = {"kind": kind}
    if name:
        d["name"] = name
    if group:
        d["group"] = group
    return d


def qualified(plural: str, group: str) -> str:
    return f"{plural}.{group}" if group else plural


def not_found(plural: str, name: str, group: str = "") -> APIError:
    return APIError(404, "NotFound", f'{qualified(plural, group)} "{name}" not found',
                    details=_details(plural, name, group))


NO_RESOURCE = "the server could not find the requested resource"


def no_such_path() -> APIError:
    """A URL that names no resource (kubectl prints this text for unknown paths)."""
    return APIError(404, "NotFound", NO_RESOURCE)


def already_exists(plural: str, name: str, group: str = "") -> APIError:
    return APIError(409, "AlreadyExists", f'{qualified(plural, group)} "{name}" already exists',
                    details=_details(plural, name, group))


def conflict(plural: str, name: str, group: str = "", why: str | None = None) -> APIError:
    why = why or ("the object has been modified; please apply your changes to the "
                  "latest version and try again")
    return APIError(409, "Conflict",
                    f'Operation cannot be fulfilled on {qualified(plural, group)} "{name}": {why}',
                    details=_details(plural, name, group))


# The reason of a field error, from the words its message starts with (apimachinery's field.ErrorType).
_REASONS = (("Forbidden", "FieldValueForbidden"), ("Required value", "FieldValueRequired"),
            ("Duplicate value", "FieldValueDuplicate"), ("Unsupported value", "FieldValueNotSupported"),
            ("Too long", "FieldValueTooLong"), ("Too many", "FieldValueTooMany"))


def _reason(message: str) -> str:
    return next((reason for words, reason in _REASONS if message.startswith(words)), "FieldValueInvalid")


def invalid(kind: str, name: str, causes: list[tuple[str, str]], group: str = "") -> APIError:
    """422 Invalid; ``causes`` are (field, message) pairs, as Kubernetes' field errors."""
    text = "; ".join(f"{f}: {m}" if f else m for f, m in causes)
    if len(causes) > 1:
        text = "[" + ", ".join(f"{f}: {m}" if f else m for f, m in causes) + "]"
    details = _details(kind, name, group)
    details["causes"] = [{"reason": _reason(m), "message": m, "field": f} for f, m in causes]
    qualified_kind = f"{kind}.{group}" if group else kind   # schema.GroupKind's String(), as NewInvalid
    return APIError(422, "Invalid", f'{qualified_kind} "{name}" is invalid: {text}', details=details)


def bad_request(message: str) -> APIError:
    return APIError(400, "BadRequest", message)


def gone(message: str) -> APIError:
    return APIError(410, "Expired", message)


def forbidden(message: str) -> APIError:
    return APIError(403, "Forbidden", message)


def unauthorized() -> APIError:
    return APIError(401, "Unauthorized", "Unauthorized")


def method_not_allowed(message: str) -> APIError:
    return APIError(405, "MethodNotAllowed", message)


OBJECT_MEDIA_TYPES = ("application/json", "application/yaml", "application/merge-patch+json",
                      "application/strategic-merge-patch+json", "application/json-patch+json",
                      "application/apply-patch+yaml")


def unsupported_media_type(ctype: str, accepted: tuple[str, ...] = OBJECT_MEDIA_TYPES) -> APIError:
    """A 415 naming the body's type and the types the path accepts (an object's by default)."""
    return APIError(415, "UnsupportedMediaType",
                    f'the body of the request was in an unknown format - accepted media types include: '
                    f'{", ".join(accepted)} (got "{ctype}")')


def too_large(message: str) -> APIError:
    return APIError(413, "RequestEntityTooLarge", message)


def request_timeout(message: str) -> APIError:
    """408: the client was too slow sending its request."""
    return APIError(408, "Timeout", message)


def too_many_requests(message: str, retry_after: int | None = None) -> APIError:
    err = APIError(429, "TooManyRequests", message)
    if retry_after is not None:
        err.headers["Retry-After"] = str(retry_after)
    return err


def service_unavailable(message: str, retry_after: int | None = None) -> APIError:
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    return APIError(503, "ServiceUnavailable", message, headers=headers)


def internal(message: str) -> APIError:
    return APIError(500, "InternalError", message)
