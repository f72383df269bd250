# syntax=docker/dockerfile:1
# One image, both programs. The first argument picks the program:
#   docker run IMAGE --listen=:9400 --backend=simulated     -> gpu-exporter --listen=:9400 ...
#   docker run IMAGE gpu-exporter --backend=simulated       -> gpu-exporter ...
#   docker run IMAGE gpu-relay run --config /etc/gpu-relay/relay.yaml
# (`docker run --entrypoint gpu-relay IMAGE run --config ...` works too.)
# Build: docker build -t gpu-telemetry:0.1.0 .   (BuildKit, the default since Docker 23)

# --- build: wheels for the project and every dependency -------------------------------------
# gcc and zlib's header (relay.native._csnappy's crc32) for the relay's native per-series core (relay/native,
# built by setup.py); the image has the Python headers. Only this stage has a compiler; the runtime
# image has zlib itself.
FROM python:3.11-slim AS build
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends build-essential zlib1g-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md setup.py ./
COPY exporter ./exporter
COPY relay ./relay
COPY telemetry_common ./telemetry_common
RUN pip wheel --no-cache-dir --wheel-dir /wheels .
# setup.py builds the extensions as optional: a wheel without one would run the slow Python
# fallback, so the build fails here unless it holds relay/native/_<name>*.so for every relay/native/<name>.c
# and every relay/native/<name>/ folder of .c files (setup.py builds one extension from each).
RUN python -c "import glob, pathlib, zipfile; \
names = zipfile.ZipFile(glob.glob('/wheels/gpu_telemetry-*.whl')[0]).namelist(); \
src = pathlib.Path('relay/native'); \
want = sorted({'relay/native/_' + (c.stem if c.parent == src else c.parent.name) for c in [*src.glob('*.c'), *src.glob('*/*.c')]}); \
missing = [w for w in want if not any(n.startswith(w + '.') and n.endswith('.so') for n in names)]; \
assert want and not missing, f'the wheel lacks native modules {missing}'"

# --- runtime ----------------------------------------------------------------------------------
FROM python:3.11-slim
LABEL org.opencontainers.image.title="gpu-telemetry" \
      org.opencontainers.image.description="gpu-exporter (NVML, dcgm-exporter schema), gpu-relay (remote-write to AMP) and gpu-jobwatch (which job holds which GPU, and its progress)" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=utility
# Install from the build stage's wheels without copying them into a layer; no compilers here.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links /wheels gpu-telemetry \
 && groupadd --gid 65532 nonroot \
 && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin nonroot \
 && mkdir -p /var/lib/gpu-relay \
 && chown 65532:65532 /var/lib/gpu-relay
# Numeric, so Kubernetes' runAsNonRoot can verify it. The exporter's DaemonSet overrides it with
# uid 0 (no capabilities) only to reach the root-owned kubelet socket; see deploy/exporter/daemonset.yaml.
# dcgm-exporter 4.8.2's collectors files at its documented paths, so `-f /etc/dcgm-exporter/<file>` (and
# DCGM_EXPORTER_COLLECTORS) from NVIDIA's chart or the GPU Operator work unchanged; the default -f.
COPY exporter/data/dcgm-exporter.default-counters.csv /etc/dcgm-exporter/default-counters.csv
COPY exporter/data/dcgm-exporter.dcp-metrics-included.csv /etc/dcgm-exporter/dcp-metrics-included.csv
COPY exporter/data/dcgm-exporter.1.x-compatibility-metrics.csv /etc/dcgm-exporter/1.x-compatibility-metrics.csv
USER 65532:65532
WORKDIR /var/lib/gpu-relay
EXPOSE 9400 9201 9202 9403
# A three-line dispatcher in the image's /bin/sh: exec keeps the program as PID 1 (signals reach it).
ENTRYPOINT ["/bin/sh", "-c", "case \"$1\" in gpu-exporter|gpu-relay|gpu-jobwatch) exec \"$@\" ;; *) exec gpu-exporter \"$@\" ;; esac", "gpu-telemetry"]
CMD []
