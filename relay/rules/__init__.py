"""The rules: Prometheus-exact relabeling (relabel, relabel_regexp), series selectors (selector),
rule plans that precompute what a rule list can do (rule_plan) and the label-key codec (label_codec).

Pure functions, labels in, labels out; no I/O, no per-series state. May import: relay.common,
relay.native, relay.ingest (the label encoding of the wire format).
"""
