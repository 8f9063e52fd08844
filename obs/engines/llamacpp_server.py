"""Start and stop a real llama.cpp ``llama-server`` on 127.0.0.1, by process group.

The process handling (launch in its own session, wait for ``/health``, SIGTERM then
SIGKILL the group, log tail) is :class:`~obs.engines.server.VllmServer`'s; only the
command line, the environment and what "installed" means differ.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from obs.engines.server import HOST, ServerError, VllmServer

# Flags every llama-server gets: loopback only, the Prometheus /metrics page (off by
# default), no web UI, and one thread per slot so it shares a small machine politely.
_FIXED_FLAGS = ("--host", HOST, "--metrics", "--no-webui", "--threads", "1")


class LlamaServer(VllmServer):
    """A ``llama-server`` process for one GGUF model, reachable at :attr:`url`.

    ``slots`` requests run at once (``--parallel``); the rest wait in its queue
    (``llamacpp:requests_deferred``). Ready in about a second with the tiny model.
    """

    LABEL = "llama-server"

    def __init__(
        self,
        model: Path,
        *,
        server: Path,
        port: int | None = None,
        served_model_name: str = "tiny",
        context: int = 2048,
        slots: int = 2,
        extra_args: Sequence[str] = (),
        log_path: Path | None = None,
        startup_timeout_s: float = 60.0,
    ) -> None:
        if slots <= 0:
            raise ValueError(f"slots must be positive, got {slots}")
        super().__init__(
            Path(model),
            port=port,
            served_model_name=served_model_name,
            max_model_len=context,
            extra_args=extra_args,
            log_path=log_path,
            python=Path(server),
            startup_timeout_s=startup_timeout_s,
        )
        self._slots = slots

    def command(self) -> list[str]:
        """The command line :meth:`start` runs."""
        return [
            str(self._python),
            "--model",
            str(self._model_dir),
            "--port",
            str(self._port),
            *_FIXED_FLAGS,
            "--alias",
            self._served_model_name,
            "--ctx-size",
            str(self._max_model_len * self._slots),  # shared by the slots
            "--parallel",
            str(self._slots),
            *self._extra_args,
        ]

    def _check_ready(self) -> None:
        if not self._python.exists():
            raise ServerError(
                f"llama-server {self._python} not found; run `vllm-obs engine setup --llamacpp`"
            )
        if not self._model_dir.is_file():
            raise ServerError(f"no GGUF model at {self._model_dir}")

    def _environment(self, cache_root: Path) -> dict[str, str]:
        return {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_ARG_")}
