"""Amazon Managed Prometheus monthly bill estimate from a sample rate (pure arithmetic, stated inputs).

Prices are the public list prices (example region, USD). Only the first ingest tier ($0.90 per 10M
samples for the first 2B a month) is on the pricing page we could check; the higher tiers are the
widely cited $0.35 / $0.16 per 10M and are marked unverified. Storage is billed per GB-month of
compressed samples; the bytes-per-sample figure is an assumption, stated in the table, and the
stored volume is the steady state after ``retention_days`` of ingest at the current rate.
The free tier (40M samples, 10 GB) is not deducted unless asked.

Regions: ``REGION_PRICES`` holds the regions whose list price we have a source for; the AWS pricing
page (https://aws.amazon.com/prometheus/pricing/, as summarised in the project's remote-write
reference, checked 2026) shows one set of figures, those of its default region US East (N.
Virginia), us-east-1. Any other region gets the same figures with a note that its own list price is
not known here. The estimate leaves out queries (billed per query sample processed) and, with
Prometheus in HA pairs, the second copy of every sample AMP ingests before it deduplicates.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

SECONDS_PER_MONTH = 730 * 3600  # AWS pricing examples use 730 hours a month
GIB = 2**30  # AWS bills 1 GB = 2^30 bytes


@dataclass(frozen=True)
class PriceTier:
    samples: float | None  # samples in this tier per month; None: everything above the previous tiers
    usd_per_10m: float
    verified: bool


@dataclass(frozen=True)
class PriceTable:
    tiers: tuple[PriceTier, ...]
    storage_usd_per_gb_month: float
    bytes_per_sample: float
    retention_days: float
    free_tier_samples: float
    free_tier_storage_gb: float
    source: str
    region_note: str
    bytes_per_sample_note: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


DEFAULT_PRICES = PriceTable(
    tiers=(
        PriceTier(2e9, 0.90, True),
        PriceTier(250e9, 0.35, False),
        PriceTier(None, 0.16, False),
    ),
    storage_usd_per_gb_month=0.03,
    bytes_per_sample=1.5,
    retention_days=150.0,
    free_tier_samples=40e6,
    free_tier_storage_gb=10.0,
    source="https://aws.amazon.com/prometheus/pricing/ (first ingest tier, storage); higher tiers unverified",
    region_note="list prices of the pricing page example; region unspecified, check yours",
    bytes_per_sample_note="assumed 1.5 bytes/sample after compression (Prometheus TSDB typically 1-2)",
)


ESTIMATE_LEAVES_OUT = (
    "queries ($0.10 per billion query samples processed) and HA duplicates: two Prometheus replicas "
    "send each sample twice (twice the requests and egress); AMP deduplicates and bills one copy only "
    "when both carry the same cluster and their own __replica__ label, else it bills both"
)

REGION_PRICES: dict[str, PriceTable] = {
    "us-east-1": replace(
        DEFAULT_PRICES,
        region_note="us-east-1 list prices (the pricing page's default region)",
    ),
}


def prices_for_region(region: str | None) -> PriceTable:
    """The list prices of ``region`` when known; else the pricing page's figures, saying so."""
    if region is not None and region in REGION_PRICES:
        return REGION_PRICES[region]
    where = f"region {region}" if region else "this destination's region"
    return replace(
        DEFAULT_PRICES,
        region_note=f"list price of {where} not known here: us-east-1 figures used, check your region's",
    )


def ingest_cost(samples: float, prices: PriceTable = DEFAULT_PRICES) -> tuple[float, list[dict[str, Any]]]:
    """USD for ``samples`` in one month, walking the tiers; returns the total and one row per tier used."""
    left = max(samples, 0.0)
    total = 0.0
    rows: list[dict[str, Any]] = []
    for tier in prices.tiers:
        if left <= 0:
            break
        n = left if tier.samples is None else min(left, tier.samples)
        usd = n / 1e7 * tier.usd_per_10m
        rows.append({"samples": n, "usd_per_10m": tier.usd_per_10m, "usd": usd, "verified": tier.verified})
        total += usd
        left -= n
    return total, rows


def estimate_monthly(samples_per_s: float, active_series: int, prices: PriceTable = DEFAULT_PRICES,
                     *, free_tier: bool = False) -> dict[str, Any]:
    """Monthly bill at the current rate: ingest by tier plus steady-state storage, with the table used."""
    samples = max(samples_per_s, 0.0) * SECONDS_PER_MONTH
    billable = max(samples - prices.free_tier_samples, 0.0) if free_tier else samples
    ingest_usd, tiers = ingest_cost(billable, prices)
    stored_gb = samples / SECONDS_PER_MONTH * 86400 * prices.retention_days * prices.bytes_per_sample / GIB
    billable_gb = max(stored_gb - prices.free_tier_storage_gb, 0.0) if free_tier else stored_gb
    storage_usd = billable_gb * prices.storage_usd_per_gb_month
    return {
        "samples_per_second": samples_per_s,
        "active_series": active_series,
        "samples_per_month": samples,
        "ingest_usd": ingest_usd,
        "ingest_tiers": tiers,
        "storage_gb": stored_gb,
        "storage_usd": storage_usd,
        "total_usd": ingest_usd + storage_usd,
        "free_tier_deducted": free_tier,
        "unverified": any(not t["verified"] for t in tiers),
        "assumptions": {"seconds_per_month": SECONDS_PER_MONTH, "gb_bytes": GIB},
        "price_table": prices.as_dict(),
    }
