"""Native parts of gpu-relay: every ``relay/native/<name>.c`` is the C extension ``relay.native._<name>``.

They are optional: where one does not build (no gcc or Python headers), the package still
installs and the relay runs its pure-Python reference code instead, saying so at start
(relay.native). ``scripts/setup.sh`` builds them in place for a checkout.
"""

from pathlib import Path

from setuptools import Extension, setup

_SRC = Path("relay/native")
_HEADERS = sorted(str(p) for p in _SRC.glob("*.h"))

setup(
    ext_modules=[
        Extension(
            f"relay.native._{c.stem}",
            sources=[str(c)],
            depends=_HEADERS,
            include_dirs=[str(_SRC)],
            libraries=["z"] if c.stem == "csnappy" else [],  # zlib's crc32 (zlib1g-dev comes with python3-dev)
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter",
                                "-fno-strict-aliasing"],
            optional=True,
        )
        for c in sorted(_SRC.glob("*.c"))
    ],
)
