"""Per-series state: the pipeline that routes a decoded request to every destination (pipeline; its
stateless cold path in decide), each destination's stage (stage; a request's metadata entries in
metadata), the decision cache (decision_cache), active-series trackers (series_tracker) and the
per-destination cardinality reports on them (cardinality), series limits and AMP's limits (limits),
aggregation windows (aggregate), the compiled rule sets (ruleset) and AMP cost estimates (cost).

Owns every per-series structure. May import: relay.common, relay.native, relay.ingest, relay.rules,
relay.config, relay.delivery (a stage puts what it keeps into its destination's queue).
"""
