"""Native parts of gpu-relay: the C extensions ``relay.native._<name>``.

An extension is either one file, ``relay/native/<name>.c``, or a folder, ``relay/native/<name>/``,
whose every ``.c`` file is compiled into it (its private headers beside them); the headers in
``relay/native/`` are shared by all. They are optional: where one does not build (no gcc or Python
headers), the package still installs and the relay runs its pure-Python reference code instead,
saying so at start (relay.native). ``scripts/setup.sh`` builds them in place for a checkout.
"""

from pathlib import Path

from setuptools import Extension, setup

_SRC = Path("relay/native")


def _extensions() -> dict[str, list[Path]]:
    """Extension name (``<name>``) -> its C sources."""
    found = {c.stem: [c] for c in _SRC.glob("*.c")}
    for folder in _SRC.iterdir():
        sources = sorted(folder.glob("*.c")) if folder.is_dir() else []
        if sources:
            if folder.name in found:
                raise SystemExit(f"relay/native: both {folder.name}.c and {folder.name}/ define _{folder.name}")
            found[folder.name] = sources
    return dict(sorted(found.items()))


def _depends(sources: list[Path]) -> list[str]:
    """Every header a change of which rebuilds the extension: the shared ones and its folder's."""
    folders = {_SRC, *(c.parent for c in sources)}
    return sorted(str(h) for f in folders for h in f.glob("*.h"))


setup(
    ext_modules=[
        Extension(
            f"relay.native._{name}",
            sources=[str(c) for c in sources],
            depends=_depends(sources),
            include_dirs=[str(_SRC)],
            libraries=["z"] if name == "csnappy" else [],  # zlib's crc32 (zlib1g-dev comes with python3-dev)
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter",
                                "-fno-strict-aliasing", "-fvisibility=hidden"],
            optional=True,
        )
        for name, sources in _extensions().items()
    ],
)
