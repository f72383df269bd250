"""Agent mode: the relay scrapes targets itself, as Prometheus 2.42 scrapes, and hands each scrape
to the pipeline as one RW 1.0 WriteRequest.

``textparse`` reads the classic text and OpenMetrics formats keeping exposed names; ``target``
joins target labels and fetches; ``loop`` keeps a target's scrape cache, staleness markers,
report series and metadata; ``scraper`` runs the threads and applies reloads.
"""

from relay.ingest.scrape.loop import REPORT_NAMES, STALE_NAN, LoopState, TargetLoop
from relay.ingest.scrape.scraper import Scraper
from relay.ingest.scrape.target import ScrapeTarget, http_fetch, instance_of
from relay.ingest.scrape.textparse import NORMAL_NAN, ParseError, parse

__all__ = ["NORMAL_NAN", "REPORT_NAMES", "STALE_NAN", "LoopState", "ParseError", "ScrapeTarget",
           "Scraper", "TargetLoop", "http_fetch", "instance_of", "parse"]  # fmt: skip
