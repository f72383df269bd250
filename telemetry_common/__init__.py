"""Code shared by gpu-exporter and gpu-relay (logging set-up)."""
