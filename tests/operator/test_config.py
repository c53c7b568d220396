"""The operator's settings from its environment: defaults, the tenant policy, and errors naming the
variable at fault."""

from __future__ import annotations

import pytest

from pathways_core.accelerators import AcceleratorKind
from pathways_core.control.tenants import Tenants
from pathways_operator.config import Config


def test_defaults_follow_the_contracts(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in (
        "PATHWAYS_NAMESPACE",
        "PATHWAYS_IMAGE",
        "PATHWAYS_METRICS_PORT",
        "PATHWAYS_TENANTS",
        "PATHWAYS_TLS_SECRET",
        "PATHWAYS_IMAGE_PULL_SECRETS",
        "PATHWAYS_CONTROL_TOKENS",
        "PATHWAYS_PEERING_LIFETIME_SECONDS",
    ):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.delenv("PATHWAYS_RESYNC_SECONDS", raising=False)
    config = Config.from_environment()
    assert (config.namespace, config.metrics_port, config.resync_seconds) == (
        "pathways-system",
        9090,
        60.0,
    )
    assert config.tenants == Tenants()
    assert config.tls_secret is None
    assert config.image_pull_secrets == ()
    assert config.control_tokens is False  # dev clusters: no token unless asked for
    assert config.peering_lifetime_seconds == 20


def test_tls_secret_names_the_secret_to_mount(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATHWAYS_TLS_SECRET", "pw-pathways-tls")
    assert Config.from_environment().tls_secret == "pw-pathways-tls"
    monkeypatch.setenv("PATHWAYS_TLS_SECRET", "  ")
    assert Config.from_environment().tls_secret is None


def test_image_pull_secrets_are_names_separated_by_commas(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATHWAYS_IMAGE_PULL_SECRETS", "regcred, other.registry ,")
    assert Config.from_environment().image_pull_secrets == ("regcred", "other.registry")


@pytest.mark.parametrize(
    ("value", "expected"),
    [("true", True), ("TRUE", True), ("1", True), ("on", True), ("false", False), ("0", False)],
)
def test_control_tokens_is_a_flag(
    monkeypatch: pytest.MonkeyPatch, value: str, expected: bool
) -> None:
    monkeypatch.setenv("PATHWAYS_CONTROL_TOKENS", value)
    assert Config.from_environment().control_tokens is expected


def test_a_session_master_key_needs_control_tokens_and_length(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PATHWAYS_SESSION_MASTER_KEY", raising=False)
    assert Config.from_environment().session_master_key is None
    monkeypatch.setenv("PATHWAYS_SESSION_MASTER_KEY", "k" * 48)
    monkeypatch.setenv("PATHWAYS_CONTROL_TOKENS", "false")
    with pytest.raises(ValueError, match="needs PATHWAYS_CONTROL_TOKENS=true"):
        Config.from_environment()
    monkeypatch.setenv("PATHWAYS_CONTROL_TOKENS", "true")
    config = Config.from_environment()
    assert config.session_master_key == b"k" * 48
    assert "kkkk" not in repr(config)  # never in a log line
    monkeypatch.setenv("PATHWAYS_SESSION_MASTER_KEY", "short")
    with pytest.raises(ValueError, match="PATHWAYS_SESSION_MASTER_KEY must be at least 32"):
        Config.from_environment()


def test_tenant_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "PATHWAYS_TENANTS",
        '{"research": {"namespaces": ["research", "research-eval"], "maxPriority": 100,'
        ' "devices": {"tpu-v5e": 64, "cpu-fake": 8}}, "*": {"maxPriority": 0}}',
    )
    tenants = Config.from_environment().tenants
    assert tenants.namespaces("research") == ("research", "research-eval")
    assert tenants.namespaces("other") == ("other",)
    assert tenants.quotas(["research", "other"]) == {
        ("research", AcceleratorKind.TPU_V5E): 64,
        ("research", AcceleratorKind.CPU_FAKE): 8,
    }
    assert (tenants.capped("research", 500), tenants.capped("other", 500)) == (100, 0)


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("PATHWAYS_TENANTS", "{not json"),
        ("PATHWAYS_TENANTS", '{"t": {"devices": {"tpu-v9": 1}}}'),
        ("PATHWAYS_TENANTS", '{"t": 5}'),
        ("PATHWAYS_TENANTS", '["t"]'),
        ("PATHWAYS_TENANTS", '{"t": {"maxPriority": "high"}}'),
        ("PATHWAYS_TENANTS", '{"t": {"maxPriority": "100"}}'),
        ("PATHWAYS_TENANTS", '{"t": {"maxPriority": true}}'),
        ("PATHWAYS_TENANTS", '{"t": {"devices": {"cpu-fake": 1.5}}}'),
        ("PATHWAYS_TENANTS", '{"t": {"namespaces": ["Not_A_Namespace"]}}'),
        ("PATHWAYS_TENANTS", '{"*": {"namespaces": ["a"]}}'),
        ("PATHWAYS_METRICS_PORT", "ninety"),
        ("PATHWAYS_RESYNC_SECONDS", "soon"),
        ("PATHWAYS_TLS_SECRET", "Not_A/Secret"),
        ("PATHWAYS_IMAGE_PULL_SECRETS", "regcred,Not_A/Secret"),
        ("PATHWAYS_CONTROL_TOKENS", "per-island"),
        ("PATHWAYS_PEERING_LIFETIME_SECONDS", "5"),
        ("PATHWAYS_PEERING_LIFETIME_SECONDS", "20.5"),
    ],
)
def test_bad_settings_name_the_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValueError, match=variable):
        Config.from_environment()
