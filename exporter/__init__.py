"""gpu-exporter: a dcgm-exporter drop-in built on NVML."""

__version__ = "0.1.0"
