"""Delivery: what goes out. The durable queue (queue/, one per destination), the sender's shard
threads (sender), one batch's send-and-classify loop (batch), shipping and splitting what a thread
holds (split), the state a destination is in and wall-clock steps (health), the retry and drop
policy (send_policy), HTTP transport (transport) and SigV4 signing (sigv4).

Owns the queues' files and the in-flight batches. May import: relay.common, relay.native,
relay.ingest, relay.rules, relay.config.
"""
