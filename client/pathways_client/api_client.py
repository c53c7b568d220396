"""An HTTP client of the REST API (what the CLI and the demo use)."""

from __future__ import annotations

import json
from typing import Any

import httpx


class ApiCallError(RuntimeError):
    """The API answered with an error: its status, code, message and field."""

    def __init__(self, status: int, code: str, message: str, field: str | None) -> None:
        where = f" ({field})" if field else ""
        super().__init__(f"{code}: {message}{where}")
        self.status, self.code, self.message, self.field = status, code, message, field


class ApiClient:
    """Calls of one tenant (its bearer token) to one API server."""

    def __init__(self, url: str, token: str | None, timeout: float = 30.0) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.url = url.rstrip("/")
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def close(self) -> None:
        """Close the connection pool."""
        self.http.close()

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(self, method: str, path: str, **arguments: Any) -> Any:
        """One request; the decoded JSON (or text) answer, or :class:`ApiCallError`."""
        try:
            answer = self.http.request(method, path, **arguments)
        except httpx.HTTPError as error:
            raise ApiCallError(0, "Unreachable", f"{self.url}: {error}", None) from None
        if answer.status_code >= 400:
            try:
                error = answer.json()["error"]
                raise ApiCallError(
                    answer.status_code, error["code"], error["message"], error.get("field")
                )
            except (ValueError, KeyError, TypeError):
                raise ApiCallError(
                    answer.status_code, "HttpError", answer.text[:200], None
                ) from None
        if answer.headers.get("content-type", "").startswith("application/json"):
            return answer.json()
        return answer.text

    # -- resources -----------------------------------------------------------------------------

    def submit(
        self, document: dict[str, Any], idempotency_key: str | None = None
    ) -> dict[str, Any]:
        """Create a PathwaysProgram or a VirtualSlice from its manifest."""
        path = "/v1/virtualslices" if document.get("kind") == "VirtualSlice" else "/v1/programs"
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return self.call(
            "POST",
            path,
            content=json.dumps(document),
            headers={**headers, "Content-Type": "application/json"},
        )

    def list(self, collection: str, **query: Any) -> list[dict[str, Any]]:
        """Every object of a collection (``programs``, ``virtualslices``, ``islands``), all
        pages."""
        items: list[dict[str, Any]] = []
        token = None
        while True:
            parameters = {k: v for k, v in query.items() if v is not None}
            if token:
                parameters["continue"] = token
            page = self.call("GET", f"/v1/{collection}", params=parameters)
            items += page["items"]
            token = page.get("continue")
            if not token:
                return items

    def get(self, collection: str, name: str) -> dict[str, Any]:
        """One object."""
        return self.call("GET", f"/v1/{collection}/{name}")

    def cancel(self, name: str) -> dict[str, Any]:
        """Cancel a program."""
        return self.call("POST", f"/v1/programs/{name}/cancel")

    def delete(self, collection: str, name: str) -> dict[str, Any]:
        """Delete a program or release a virtual slice."""
        return self.call("DELETE", f"/v1/{collection}/{name}")

    def logs(self, name: str) -> str:
        """A program's output."""
        return self.call("GET", f"/v1/programs/{name}/logs")["logs"]

    def events(self, name: str) -> list[dict[str, Any]]:
        """A program's Events."""
        return self.call("GET", f"/v1/programs/{name}/events")["items"]

    def trace(self, name: str) -> list[dict[str, Any]]:
        """A program's island trace records."""
        return self.call("GET", f"/v1/programs/{name}/trace")["records"]

    def me(self) -> dict[str, Any]:
        """The caller's tenant, quotas and usage."""
        return self.call("GET", "/v1/me")
