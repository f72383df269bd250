"""The durable queue: one SQLite file per destination, rows of snappy blocks, acked in order per
shard. durable (the DurableQueue, built bottom up from state (per-shard counts), store (the file's
upkeep), acks, reads (peek) and commit (group commit, trim)), codec (row encoding), files and
opening (the file, its schema and recovery), pages (page accounting), recent (rows kept in memory
for peek), types (shared types).

May import: relay.common, relay.native, relay.proto.
"""
