"""Errors the API answers with: JSON ``{"error": {"code", "message", "field"}}``.

Every error names what went wrong in one sentence and, when one field is at fault, its path in
the request (``spec.slices[0].devices``, ``header Authorization``, ``query limit``).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class ErrorBody(BaseModel):
    """What went wrong."""

    code: str = Field(description="One CamelCase word, such as InvalidField or QuotaExceeded.")
    message: str = Field(description="What went wrong, for humans.")
    field: str | None = Field(default=None, description="Path of the field at fault, if one is.")


class ErrorResponse(BaseModel):
    """The body of every error response."""

    error: ErrorBody


class ApiError(Exception):
    """An error answered with ``status`` and a JSON body."""

    status = 400
    code = "BadRequest"

    def __init__(
        self,
        message: str,
        *,
        field: str | None = None,
        status: int | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        if status is not None:
            self.status = status
        if code is not None:
            self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        """The JSON body."""
        return {"error": {"code": self.code, "message": self.message, "field": self.field}}


class Unauthorized(ApiError):
    status, code = 401, "Unauthorized"

    def __init__(self, message: str) -> None:
        super().__init__(
            message, field="header Authorization", headers={"WWW-Authenticate": "Bearer"}
        )


class Forbidden(ApiError):
    status, code = 403, "Forbidden"


class NotFound(ApiError):
    status, code = 404, "NotFound"


class Conflict(ApiError):
    status, code = 409, "Conflict"


class QuotaExceeded(ApiError):
    status, code = 429, "QuotaExceeded"


class StoreDamaged(ApiError):
    """The embedded store's file holds something it never wrote (edited by hand, or damaged):
    the message names what and what to do; the rest of the store keeps serving."""

    status, code = 500, "StoreDamaged"


class RateLimited(ApiError):
    """The tenant sent more requests than its rate limit allows; nothing was done, and the
    ``Retry-After`` header says when to try again."""

    status, code = 429, "RateLimited"


class InvalidField(ApiError):
    status, code = 422, "InvalidField"


class TooLarge(ApiError):
    status, code = 413, "BodyTooLarge"


class UnsupportedMediaType(ApiError):
    """A body in a media type the API does not read (the message lists those it does)."""

    status, code = 415, "UnsupportedMediaType"


class Unavailable(ApiError):
    status, code = 503, "Unavailable"


class StoreBusy(Unavailable):
    """The embedded store's file stayed locked by another writer (the manager, another API
    process) for the whole busy timeout: nothing was done; ``Retry-After`` says when to retry."""

    code = "StoreBusy"


RETRY_AFTER_HEADER = {
    "Retry-After": {
        "description": "With RateLimited or StoreBusy: whole seconds to wait before retrying.",
        "schema": {"type": "integer", "minimum": 1},
    }
}

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {
        "model": ErrorResponse,
        "description": description,
        **({"headers": RETRY_AFTER_HEADER} if status in (429, 503) else {}),
    }
    for status, description in (
        (400, "Malformed request (unparseable JSON or YAML, bad query)"),
        (401, "Missing or invalid bearer token"),
        (403, "The tenant may not ask for this (a priority above its cap: error.field)"),
        (404, "No such object (or another tenant's)"),
        (409, "Conflict: the name is taken, or the Idempotency-Key was used with another body"),
        (413, "Request body larger than the limit"),
        (
            415,
            "The body's Content-Type is not one the API reads (JSON: application/json or "
            "application/*+json; YAML: application/yaml, application/x-yaml, text/yaml)",
        ),
        (422, "A field is invalid; error.field names it"),
        (
            429,
            "The tenant's quota would be exceeded (QuotaExceeded), or the tenant is over its "
            "rate limit (RateLimited: nothing was done; retry after Retry-After seconds)",
        ),
        (500, "An unexpected error (InternalError; the server logs its details)"),
        (
            503,
            "The store cannot answer now (StoreBusy: the embedded store stayed locked by "
            "another writer, nothing was done, retry after Retry-After seconds; Unavailable: "
            "the Kubernetes API server did not answer)",
        ),
    )
}
"""The error responses every route may give, for the OpenAPI schema."""
