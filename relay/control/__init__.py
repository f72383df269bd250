"""The control plane: the runtime that wires the stages together and reloads them (service,
destinations, shardplan), the daemon and CLI (daemon, cli, configwatch, interpreter), and what the
relay tells people (report, overview, statuspage, explain, preflight).

May import every other relay package; none of them imports this one.
"""
