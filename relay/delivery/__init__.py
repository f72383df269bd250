"""Delivery: what goes out. The durable queue (queue/, one per destination), the sender and its
shards' send loop (sender), the retry and drop policy (send_policy), HTTP transport (transport) and
SigV4 signing (sigv4).

Owns the queues' files and the in-flight batches. May import: relay.common, relay.native,
relay.ingest, relay.rules, relay.config.
"""
