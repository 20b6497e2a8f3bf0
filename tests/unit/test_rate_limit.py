"""The rate limiter alone, on a clock the test moves: requests and tokens per minute per
(account, model), the seconds to wait, and one key never touching another."""

import pytest

from runtime.control.rate_limit import ACCOUNT_LIMITED, AccountLimited, AccountRateLimits, Limits, RateLimiter


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock():
    return Clock()


def test_rpm_admits_that_many_a_minute_then_says_when_to_retry(clock):
    limiter = RateLimiter(clock)
    rpm3 = Limits(rpm=3)
    for _ in range(3):
        assert limiter.admit("a", "m", rpm3) is None
        clock.now += 10
    refusal = limiter.admit("a", "m", rpm3)
    assert refusal is not None and refusal.limit == "rpm" and refusal.allowed == 3 and refusal.used == 3
    assert refusal.retry_after == 30  # the first request (at 1000) leaves the window at 1060; now 1030
    clock.now += 29.5
    assert limiter.admit("a", "m", rpm3).retry_after == 1  # half a second left: at least 1
    clock.now += 0.5
    assert limiter.admit("a", "m", rpm3) is None  # the window slid past the first
    assert limiter.admit("a", "m", rpm3).limit == "rpm"


def test_a_refused_request_is_not_counted(clock):
    limiter = RateLimiter(clock)
    assert limiter.admit("a", "m", Limits(rpm=1)) is None
    for _ in range(50):
        assert limiter.admit("a", "m", Limits(rpm=1)) is not None
    clock.now += 60
    assert limiter.admit("a", "m", Limits(rpm=1)) is None


def test_keys_are_separate_by_account_and_by_model(clock):
    limiter = RateLimiter(clock)
    one = Limits(rpm=1)
    assert limiter.admit("a", "m", one) is None
    assert limiter.admit("a", "m", one) is not None
    assert limiter.admit("b", "m", one) is None  # another account
    assert limiter.admit("a", "other-model", one) is None  # another model


def test_tpm_refuses_a_request_that_would_start_over_it_until_tokens_leave(clock):
    limiter = RateLimiter(clock)
    tpm = Limits(tpm=100)
    assert limiter.admit("a", "m", tpm) is None
    limiter.count_tokens("a", "m", 60)
    clock.now += 20
    assert limiter.admit("a", "m", tpm) is None  # 60 < 100: it may start
    limiter.count_tokens("a", "m", 70)  # the running request carried it past: 130
    clock.now += 5
    refusal = limiter.admit("a", "m", tpm)
    assert refusal.limit == "tpm" and refusal.used == 130 and refusal.allowed == 100
    assert refusal.retry_after == 35  # the first 60 leave at 1060 (now 1025), leaving 70 < 100
    clock.now += 35
    assert limiter.admit("a", "m", tpm) is None
    assert limiter.admit("b", "m", tpm) is None  # never another account's


def test_no_limits_admit_everything(clock):
    limiter = RateLimiter(clock)
    for _ in range(1000):
        assert limiter.admit("a", "m", Limits()) is None
        limiter.count_tokens("a", "m", 10_000)


def test_account_rate_limits_raise_3036_naming_the_limit_and_count_the_refusal(clock):
    refused = []
    limits = AccountRateLimits(
        lambda account: Limits(rpm=2) if account == "small" else Limits(),
        RateLimiter(clock),
        lambda *key: refused.append(key),
    )
    limits.check("small", "@edge/x", "@cf/alias")
    limits.check("small", "@edge/x")
    with pytest.raises(AccountLimited) as info:
        limits.check("small", "@edge/x", "@cf/alias")
    exc = info.value
    assert exc.code == ACCOUNT_LIMITED == 3036 and exc.retry_after == 60
    assert str(exc).startswith("3036: Account limited: account 'small'")
    assert "2 requests per minute for model '@cf/alias'" in exc.detail and "retry in 60 s" in exc.detail
    assert refused == [("small", "@edge/x", "rpm")]
    for _ in range(10):
        limits.check("big", "@edge/x")  # unaffected
