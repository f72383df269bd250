#!/usr/bin/env bash
# Idempotent set-up on a fresh Debian machine: the Debian packages the tests and the demo use
# (real Prometheus and vmagent as peers, headless Chromium for the status page), and a virtualenv
# in .venv with the project installed.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v prometheus >/dev/null 2>&1 || need_apt+=(prometheus)
command -v promtool >/dev/null 2>&1 || need_apt+=(prometheus)
command -v vmagent >/dev/null 2>&1 || need_apt+=(victoria-metrics)
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)  # the status page e2e test (headless)
# gcc and the Python headers build the relay's native per-series core (relay/native, setup.py)
command -v gcc >/dev/null 2>&1 || need_apt+=(build-essential)
PY=${PYTHON:-python3}
py_include=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])' 2>/dev/null || true)
[ -n "$py_include" ] && [ -f "$py_include/Python.h" ] || need_apt+=(python3-dev)
[ -f /usr/include/zlib.h ] || need_apt+=(zlib1g-dev)  # relay.native._csnappy's crc32 (python3-dev brings it too)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
  # The Debian packages start system services; the tests start their own instances.
  for svc in prometheus prometheus-node-exporter victoria-metrics; do
    $SUDO systemctl stop "$svc" >/dev/null 2>&1 || true
  done
fi

if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  "$PY" -m venv .venv
fi
stamp=.venv/.installed-$(sha1sum pyproject.toml | cut -c1-12)
if [ ! -f "$stamp" ]; then
  echo "setup: installing gpu-telemetry and its dev dependencies into .venv"
  if ! { .venv/bin/python -m pip install -q --upgrade pip && .venv/bin/python -m pip install -q -e '.[dev]'; } \
       >.venv/pip.log 2>&1; then
    echo "setup: pip install failed; its output:" >&2; tail -n 40 .venv/pip.log >&2; exit 1
  fi
  rm -f .venv/.installed-*; touch "$stamp"
fi

# The native core, built in place (so the checkout imports it); again whenever a source changes: the
# stamp covers setup.py and every .c and .h below relay/native (names and contents), so an edit, an
# added or a removed file in relay/native/<name>/ rebuilds as one in relay/native does.
native=.native-stamp
native_sources() { find relay/native -type f \( -name '*.c' -o -name '*.h' \) | LC_ALL=C sort; }
# every extension setup.py builds: relay/native/<name>.c and relay/native/<name>/ (a folder of .c files)
native_modules() { native_sources | sed -n -e 's#^relay/native/\([^/]*\)\.c$#\1#p' -e 's#^relay/native/\([^/]*\)/[^/]*\.c$#\1#p' | sort -u; }
native_missing() { for m in $(native_modules); do ls relay/native/_"$m".*.so >/dev/null 2>&1 || echo "_$m"; done; }
want=$( { cat setup.py; native_sources; native_sources | xargs -r cat; } | sha1sum | cut -c1-12)
if [ "$(cat "$native" 2>/dev/null)" != "$want" ] || [ -n "$(native_missing)" ]; then
  echo "setup: building the relay's native core (relay/native)"
  if ! .venv/bin/python setup.py -q build_ext --inplace >.venv/build_ext.log 2>&1; then
    echo "setup: building the native core failed; its output:" >&2; tail -n 40 .venv/build_ext.log >&2; exit 1
  fi
  missing=$(native_missing)
  if [ -n "$missing" ]; then  # (setup.py's extensions are optional: a failed one is only a warning there)
    echo "setup: native modules did not build: $missing; the build's output:" >&2; tail -n 40 .venv/build_ext.log >&2; exit 1
  fi
  echo "$want" >"$native"
fi
