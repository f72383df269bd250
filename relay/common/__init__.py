"""Primitives every stage of the relay may use: label sets (labels), sizes and durations (units),
protobuf wire-format helpers (protowire), HTTP/1.1 head parsing shared by the write endpoint and the
sender's transport (http_head), rate-limited logging (ratelog) and the self-metrics registry (metrics).

Owns no state of its own. May import: relay.native only.
"""
