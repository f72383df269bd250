"""The configuration: read once, validated with file:line:field errors, passed down as frozen
dataclasses. YAML with positions (yamlnodes), the model (model, parts, config), ${VAR} expansion
(envexpand), Prometheus remote_write syntax (promremote) and `import-prometheus` (promimport).

May import: relay.common, relay.rules (relabel rules are parsed and checked here).
"""
