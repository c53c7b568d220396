"""Who a token is: a tokens file may not give one token to two tenants, and in kubernetes mode
a flood of made-up tokens does not lock out the tenants whose tokens were taken before."""

from __future__ import annotations

import asyncio
import hashlib

import pytest

from pathways_api.auth import Tenant, TokenFile, TokensFileError
from pathways_api.errors import RateLimited, Unauthorized
from pathways_api.kube_store import NEW_TOKEN_BURST, REVIEW_TTL_SECONDS, TokenReviewer

SECRET = "shared-secret-token"
DIGEST = "sha256:" + hashlib.sha256(SECRET.encode()).hexdigest()


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (SECRET, SECRET),
        (SECRET, DIGEST),
        (DIGEST, SECRET),
        (SECRET, "sha256:" + DIGEST[7:].upper()),
    ],
    ids=["raw-twice", "raw-then-digest", "digest-then-raw", "digest-in-capitals"],
)
def test_a_token_of_two_tenants_is_refused_naming_both_not_the_token(
    first: str, second: str
) -> None:
    document = {
        "tenants": {
            "team-a": {"tokens": ["token-a", first], "quotas": {"devices": 2, "priority": 0}},
            "team-b": {"tokens": [second], "quotas": {"devices": 64, "priority": 1000}},
        }
    }
    with pytest.raises(TokensFileError) as refused:
        TokenFile.parse(document)
    message = str(refused.value)
    assert "tenants.team-b.tokens[0]" in message and "tenants.team-a.tokens[1]" in message
    assert "'team-a'" in message and "'team-b'" in message
    assert SECRET not in message and hashlib.sha256(SECRET.encode()).hexdigest() not in message


def test_a_token_listed_twice_for_one_tenant_is_that_tenants() -> None:
    tokens = TokenFile.parse({"tenants": {"team-a": {"tokens": [SECRET, SECRET, DIGEST]}}})
    assert {tenant.name for tenant in tokens.values()} == {"team-a"}


class FakeReviews:
    """TokenReview + SubjectAccessReview: ``good`` is team-a's, ``revoked`` stops being
    accepted once ``revoke`` is called, everything else is refused."""

    def __init__(self) -> None:
        self.reviews: list[str] = []
        self.revoked = False
        self.gate: asyncio.Event | None = None

    async def review(self, token: str) -> Tenant:
        self.reviews.append(token)
        if self.gate is not None:
            await self.gate.wait()
        if token == "good" or (token == "revoked" and not self.revoked):
            return Tenant("team-a")
        raise Unauthorized("invalid bearer token (TokenReview)")


def flood(reviewer: TokenReviewer, count: int) -> int:
    """``count`` made-up tokens at once; how many were refused with 429."""

    async def send() -> int:
        limited = 0
        for n in range(count):
            try:
                await reviewer.authenticate(f"junk-{n}")
            except RateLimited:
                limited += 1
            except Unauthorized:
                pass
        return limited

    return asyncio.run(send())


def test_a_flood_of_made_up_tokens_does_not_lock_out_a_known_token() -> None:
    store, now = FakeReviews(), [0.0]
    reviewer = TokenReviewer(store, clock=lambda: now[0])  # type: ignore[arg-type]
    assert asyncio.run(reviewer.authenticate("good")).name == "team-a"
    now[0] = REVIEW_TTL_SECONDS + 1  # its answer is too old: reviewed again
    assert flood(reviewer, NEW_TOKEN_BURST + 100) > 0  # new tokens are still limited
    before = store.reviews.count("good")
    assert asyncio.run(reviewer.authenticate("good")).name == "team-a"
    assert store.reviews.count("good") == before + 1  # reviewed again, not served stale


def test_a_known_token_revoked_since_is_refused_when_reviewed_again() -> None:
    store, now = FakeReviews(), [0.0]
    reviewer = TokenReviewer(store, clock=lambda: now[0])  # type: ignore[arg-type]
    assert asyncio.run(reviewer.authenticate("revoked")).name == "team-a"
    store.revoked = True
    now[0] = REVIEW_TTL_SECONDS + 1
    flood(reviewer, NEW_TOKEN_BURST + 100)
    with pytest.raises(Unauthorized):
        asyncio.run(reviewer.authenticate("revoked"))
    # Refused, it is no longer known: it waits its turn with the other new tokens.
    now[0] += REVIEW_TTL_SECONDS + 1
    flood(reviewer, NEW_TOKEN_BURST + 100)
    with pytest.raises(RateLimited):
        asyncio.run(reviewer.authenticate("revoked"))


def test_concurrent_requests_of_one_token_share_one_review() -> None:
    store = FakeReviews()
    reviewer = TokenReviewer(store)  # type: ignore[arg-type]

    async def many() -> list[str]:
        store.gate = asyncio.Event()
        waiting = [asyncio.ensure_future(reviewer.authenticate("good")) for _ in range(20)]
        await asyncio.sleep(0)
        store.gate.set()
        return [tenant.name for tenant in await asyncio.gather(*waiting)]

    assert asyncio.run(many()) == ["team-a"] * 20
    assert store.reviews == ["good"]
