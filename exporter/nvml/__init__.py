"""NVML reads: the backend (backend), device discovery and MIG (devices), field reads (fields), Hopper
profiling through GPM (gpm), the capability probe (probe) and XID event registration (xid).

May import: exporter.backend (the Backend protocol and its records).
"""
