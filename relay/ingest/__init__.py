"""Ingest: what comes in. The HTTP write endpoint (server, http_conn), Remote-Write 1.0 and 2.0
decoding and validation (wire, wire_entries, wire_v2, rwsplit) and agent-mode scraping (scrape).

Decodes and validates; decides nothing about series. May import: relay.common, relay.native.
"""
