"""gpu-relay: a cardinality-aware Prometheus remote-write relay with SigV4 for AMP."""

__version__ = "0.1.0"
