from __future__ import annotations

import json

import pytest

from relay.state.cost import (
    DEFAULT_PRICES,
    GIB,
    SECONDS_PER_MONTH,
    PriceTable,
    PriceTier,
    estimate_monthly,
    ingest_cost,
)


def test_month_is_730_hours() -> None:
    assert SECONDS_PER_MONTH == 2_628_000


def test_estimate_at_1000_samples_per_second_crosses_into_second_tier() -> None:
    est = estimate_monthly(1000.0, 50_000)
    samples = 1000 * 2_628_000  # 2.628e9 samples a month
    assert est["samples_per_month"] == samples
    # first 2e9 at $0.90 per 1e7 = 180.00; remaining 0.628e9 at $0.35 per 1e7 = 21.98
    assert est["ingest_usd"] == pytest.approx(180.00 + 21.98)
    assert [t["samples"] for t in est["ingest_tiers"]] == [2e9, pytest.approx(0.628e9)]
    assert est["unverified"] is True  # the $0.35 tier is not on the pricing page we checked
    # storage at steady state: 1000/s * 86400 s * 150 days * 1.5 B / 2^30 B = 18.1048 GB; * $0.03
    gb = 1000 * 86400 * 150 * 1.5 / 2**30
    assert est["storage_gb"] == pytest.approx(gb)
    assert est["storage_usd"] == pytest.approx(gb * 0.03)
    assert est["total_usd"] == pytest.approx(201.98 + 0.543144, abs=1e-5)
    assert est["active_series"] == 50_000
    assert est["free_tier_deducted"] is False


def test_estimate_in_first_tier_is_verified() -> None:
    est = estimate_monthly(10.0, 100)
    # 10/s * 2,628,000 s = 26.28e6 samples; 2.628 * $0.90 = $2.3652
    assert est["ingest_usd"] == pytest.approx(2.3652)
    assert est["unverified"] is False


def test_free_tier_is_deducted_only_when_asked() -> None:
    est = estimate_monthly(1000.0, 0, free_tier=True)
    # (2.628e9 - 40e6) = 2.588e9: 180.00 + 0.588e9 / 1e7 * 0.35 = 180.00 + 20.58
    assert est["ingest_usd"] == pytest.approx(200.58)
    # 18.1048 GB - 10 GB free = 8.1048 GB * $0.03
    assert est["storage_usd"] == pytest.approx((1000 * 86400 * 150 * 1.5 / GIB - 10) * 0.03)
    assert est["free_tier_deducted"] is True


def test_third_tier_applies_above_252_billion() -> None:
    total, rows = ingest_cost(300e9)
    # 2e9 @0.90 = 180; 250e9 @0.35 = 8750; 48e9 @0.16 = 768
    assert total == pytest.approx(180 + 8750 + 768)
    assert [r["usd_per_10m"] for r in rows] == [0.90, 0.35, 0.16]


def test_zero_and_negative_rates_cost_nothing() -> None:
    assert estimate_monthly(0.0, 0)["total_usd"] == 0.0
    assert estimate_monthly(-5.0, 0)["total_usd"] == 0.0


def test_custom_price_table_is_used_and_reported() -> None:
    prices = PriceTable(tiers=(PriceTier(None, 1.0, True),), storage_usd_per_gb_month=0.0,
                        bytes_per_sample=1.0, retention_days=1.0, free_tier_samples=0.0,
                        free_tier_storage_gb=0.0, source="test", region_note="", bytes_per_sample_note="")
    est = estimate_monthly(1.0, 0, prices)
    assert est["total_usd"] == pytest.approx(2_628_000 / 1e7 * 1.0)
    assert est["price_table"]["source"] == "test"


def test_estimate_is_json_serialisable_and_states_assumptions() -> None:
    est = json.loads(json.dumps(estimate_monthly(100.0, 10)))
    table = est["price_table"]
    assert table["bytes_per_sample"] == DEFAULT_PRICES.bytes_per_sample
    assert "bytes/sample" in table["bytes_per_sample_note"]
    assert [t["verified"] for t in table["tiers"]] == [True, False, False]


def test_a_known_region_gets_its_list_prices_and_an_unknown_one_says_so() -> None:
    from relay.state.cost import DEFAULT_PRICES, REGION_PRICES, prices_for_region

    known = prices_for_region("us-east-1")
    assert known is REGION_PRICES["us-east-1"]
    assert known.tiers == DEFAULT_PRICES.tiers
    assert "us-east-1 list prices" in known.region_note
    other = prices_for_region("ap-southeast-2")
    assert other.tiers == DEFAULT_PRICES.tiers
    assert "region ap-southeast-2 not known here" in other.region_note
    assert "not known here" in prices_for_region(None).region_note


def test_the_estimate_says_what_it_leaves_out() -> None:
    from relay.state.cost import ESTIMATE_LEAVES_OUT

    assert "queries" in ESTIMATE_LEAVES_OUT
    assert "HA" in ESTIMATE_LEAVES_OUT and "twice" in ESTIMATE_LEAVES_OUT


def test_amp_region_is_read_from_the_workspace_host_only() -> None:
    from relay.control.destinations import amp_region

    assert amp_region("https://aps-workspaces.eu-west-1.amazonaws.com/workspaces/ws-1/api/v1/remote_write") \
        == "eu-west-1"
    assert amp_region("https://APS-WORKSPACES.us-east-1.amazonaws.com/x") == "us-east-1"
    assert amp_region("http://127.0.0.1:9090/api/v1/write") is None
    assert amp_region("https://aps-workspaces.us-east-1.example.com/x") is None
    assert amp_region("https://vm.example/aps-workspaces.us-east-1.amazonaws.com") is None
