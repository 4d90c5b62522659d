"""Stored times ahead of the clock (issue 31, class 6): a token store's ``issued_at``, the last
full refresh and the renewal sensor's last test, read from local state, lie ahead of now. Each is
treated as unknown (beyond a few minutes of tolerance) and the output says why.

Before: a store restored from a host whose clock ran 30 days fast postponed renewal by 30 days
while the sensor called the token fine; tokens live two months, so it died first.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from fieldsales_dagster.client.endpoints import CHECK_TOKEN_PATH, GENERATE_TOKEN_PATH
from fieldsales_dagster.clock import FUTURE_TOLERANCE, from_the_future
from fieldsales_dagster.loading.refresh_mode import PreviousLoad, choose_mode
from fieldsales_dagster_tests.test_token_renewal_sensor import (
    accepted,
    backdate,
    make_api,
    requests_to,
    server,  # noqa: F401 - a fixture
    store_path,  # noqa: F401 - a fixture
    stored_token,
    tick,
)

NOW = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize("days_ahead", [30, 1, 0.01])
def test_a_token_store_issued_in_the_future_is_renewed_saying_why(
    server,  # noqa: F811 - the fixture
    store_path,  # noqa: F811 - the fixture
    days_ahead,
):
    api = make_api(server, store_path)
    tick(api)
    backdate(store_path, -days_ahead)  # restored from a host whose clock ran fast
    old_token = stored_token(store_path)
    message = tick(api).message
    assert message.startswith("token renewed because the token store's issued_at (")
    assert f"lies {days_ahead:.1f} days ahead of this host's clock" in message
    assert "treated as unknown" in message
    assert requests_to(server, GENERATE_TOKEN_PATH) == 1
    assert stored_token(store_path) != old_token and accepted(server, stored_token(store_path))
    assert tick(api).message.startswith("not yet due: 45.0 days left")  # renewed: sane


def test_a_token_store_a_minute_ahead_is_a_clock_difference_not_a_lie(
    server,  # noqa: F811 - the fixture
    store_path,  # noqa: F811 - the fixture
):
    api = make_api(server, store_path)
    tick(api)
    backdate(store_path, -60 / 86400)
    assert tick(api).message.startswith("not yet due: 45.0 days left")
    assert requests_to(server, GENERATE_TOKEN_PATH) == 0


def test_a_last_token_test_in_the_future_does_not_postpone_the_daily_test(
    server,  # noqa: F811 - the fixture
    store_path,  # noqa: F811 - the fixture
):
    api = make_api(server, store_path)
    tick(api)
    assert requests_to(server, CHECK_TOKEN_PATH) == 1
    in_a_month = (datetime.now(UTC) + timedelta(days=30)).isoformat()
    result = tick(api, cursor=in_a_month)
    assert requests_to(server, CHECK_TOKEN_PATH) == 2
    assert result.ran and "accepted by the server" in result.message
    assert result.cursor != in_a_month


def previous(last_full_at: datetime) -> PreviousLoad:
    return PreviousLoad(
        last_full_at=last_full_at,
        rows_recorded=10,
        rows_stored=10,
        events_loaded_at_recorded=NOW - timedelta(days=1),
        events_loaded_at_now=NOW,
    )


def test_a_last_full_refresh_in_the_future_makes_auto_run_a_full_refresh_saying_why():
    decision = choose_mode(
        "auto", previous(NOW + timedelta(days=30)), now=NOW, full_refresh_every_days=7
    )
    assert decision.mode == "full"
    assert decision.reason == (
        "the last full refresh (2026-12-26 12:00 UTC) lies 30.0 days ahead of this host's clock "
        "(a clock that ran fast, or a hand edit), so it is treated as unknown"
    )
    within = choose_mode(
        "auto", previous(NOW + FUTURE_TOLERANCE), now=NOW, full_refresh_every_days=7
    )
    assert within.mode == "incremental"


def test_the_rule_is_one_helper_with_a_small_tolerance():
    assert from_the_future(None, NOW, "x") is None
    assert from_the_future(NOW + FUTURE_TOLERANCE, NOW, "x") is None
    assert from_the_future(NOW.replace(tzinfo=None) + timedelta(hours=1), NOW, "x") is not None
    assert timedelta(minutes=10) >= FUTURE_TOLERANCE
