"""The durable queue: one SQLite file per destination, rows of snappy blocks, acked in order per
shard. durable (the DurableQueue), codec (row encoding), files and opening (the file, its schema and
recovery), pages (page accounting), recent (rows kept in memory for peek), state (per-shard state),
types (shared types).

May import: relay.common, relay.native, relay.proto.
"""
