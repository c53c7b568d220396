"""Property-based fuzzing of the API from its own OpenAPI schema (schemathesis): whatever the
input, no 5xx and every response matches the schema."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

import schemathesis
from api_server import TENANTS
from hypothesis import HealthCheck, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from pathways_api.app import create_app
from pathways_api.auth import TokenFile, write_tokens_file
from pathways_api.service import Service
from pathways_api.store import SqliteStore

STATE = Path(tempfile.mkdtemp(prefix="pathways-fuzz-"))
atexit.register(shutil.rmtree, STATE, ignore_errors=True)
APP = create_app(
    Service(SqliteStore(STATE / "pathways.db")),
    TokenFile(write_tokens_file(STATE / "tokens.yaml", TENANTS)),
)
schema = schemathesis.openapi.from_asgi("/openapi.json", APP)
CHECKS = [
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
    content_type_conformance,
]


@schema.parametrize()
@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,  # the same examples every run: a failure reproduces
)
def test_no_input_gives_a_server_error_or_breaks_the_schema(case: schemathesis.Case) -> None:
    case.call_and_validate(headers={"Authorization": "Bearer token-a"}, checks=CHECKS)
