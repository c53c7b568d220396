"""Tenants' quotas as an operator writes them, in the embedded tokens file or the cluster's
``PATHWAYS_API_QUOTA_*`` variables: whole numbers within bounds, or a refusal naming the
setting; never coerced (``2.9`` read as 2, ``"8"`` as 8, ``true`` as 1) nor left negative (a
negative device quota would refuse every submission without saying why)."""

from __future__ import annotations

import pytest

from pathways_api.auth import Quotas, TokenFile, TokensFileError, quotas_from_environment


def tenants(quotas: object) -> dict:
    return {"tenants": {"team-a": {"tokens": ["t"], "quotas": quotas}}}


def test_the_tokens_files_quotas_are_read_as_written() -> None:
    parsed = TokenFile.parse(tenants({"devices": 0, "programs": 3, "priority": -5}))
    assert parsed["t"].quotas == Quotas(devices=0, programs=3, priority=-5)
    assert TokenFile.parse(tenants(None))["t"].quotas == Quotas()


@pytest.mark.parametrize(
    ("quotas", "message"),
    [
        (
            {"devices": 2.9},
            r"tenants\.team-a\.quotas\.devices: expected a whole number 0 or more, not 2\.9",
        ),
        ({"devices": "8"}, r"quotas\.devices: expected a whole number 0 or more, not '8'"),
        ({"programs": True}, r"quotas\.programs: expected a whole number 0 or more, not True"),
        ({"devices": -3}, r"quotas\.devices: expected a whole number 0 or more, not -3"),
        (
            {"priority": 10**10},
            r"quotas\.priority: expected a whole number from -1000000000 to 1000000000",
        ),
        ({"gpus": 1}, r"quotas: unknown quota 'gpus' \(quotas are devices, programs, priority\)"),
        ([1, 2], r"tenants\.team-a\.quotas: expected a mapping of quotas"),
    ],
)
def test_a_quota_that_is_not_a_whole_number_in_bounds_is_refused_by_name(quotas, message):
    with pytest.raises(TokensFileError, match=message):
        TokenFile.parse(tenants(quotas))


def test_the_clusters_quotas_come_from_its_variables() -> None:
    assert quotas_from_environment({}) == Quotas(priority=0)  # no tenant preempts another
    assert quotas_from_environment(
        {"PATHWAYS_API_QUOTA_DEVICES": " 8 ", "PATHWAYS_API_QUOTA_PRIORITY": "100"}
    ) == Quotas(devices=8, priority=100)
    for variable, text in [
        ("PATHWAYS_API_QUOTA_DEVICES", "8.5"),
        ("PATHWAYS_API_QUOTA_PROGRAMS", "-1"),
        ("PATHWAYS_API_QUOTA_PRIORITY", "high"),
    ]:
        with pytest.raises(ValueError, match=f"^{variable}: expected a whole number"):
            quotas_from_environment({variable: text})
