"""Build llama.cpp's ``llama-server`` from source and the tiny GGUF model, idempotently.

The source comes from a registry: the ``llama-cpp-python`` sdist on PyPI vendors
llama.cpp's whole tree, ``tools/server`` included. Only the ``llama-server``
target is built (CPU, static, no HTTPS, no web UI download) with cmake and the
system C++ compiler, under ``nice``; the binary is cached under
``<engine home>/llamacpp/<version>/bin`` and the build tree is kept beside it, so
a changed flag rebuilds only what it touches. A second call finds the markers
and returns at once.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from hashlib import sha256
from pathlib import Path

from obs.engines.setup import (
    EngineSetupError,
    Progress,
    engine_home,
    locked,
    read_json,
    run_logged,
)

LLAMACPP_SDIST = "llama-cpp-python"
LLAMACPP_VERSION = "0.3.36"
TINY_GGUF_SEED = 0
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DGGML_NATIVE=ON",
    "-DLLAMA_BUILD_APP=OFF",
)
_TARGET = ("--target", "llama-server", "-j")
_PIP_SDIST = ("-m", "pip", "download", "--no-deps", "--no-binary", ":all:")
_MARKER = ".vllm-obs-llamacpp.json"
_BUILD_TIMEOUT_S = 7200.0


@dataclass(frozen=True)
class LlamaCppPaths:
    """Where a ready llama.cpp server and its tiny model live."""

    server: Path
    """The ``llama-server`` binary."""
    model: Path
    """The tiny random-weight GGUF model."""


def llamacpp_root(home: Path) -> Path:
    return home / "llamacpp"


def ensure_llamacpp(progress: Progress = print, home: Path | None = None) -> LlamaCppPaths:
    """Build ``llama-server`` and the tiny GGUF model unless already cached."""
    home = engine_home() if home is None else home
    root = llamacpp_root(home)
    root.mkdir(parents=True, exist_ok=True)
    with locked(root / ".lock"):
        server = _ensure_server(root, progress)
        model = _ensure_model(home / "models" / "tiny-gguf", progress)
    return LlamaCppPaths(server=server, model=model)


def _ensure_server(root: Path, progress: Progress) -> Path:
    target = root / LLAMACPP_VERSION / "bin" / "llama-server"
    spec = {"sdist": f"{LLAMACPP_SDIST}=={LLAMACPP_VERSION}", "cmake": list(CMAKE_FLAGS)}
    marker = target.parent.parent / _MARKER
    if target.exists() and read_json(marker) == spec:
        progress(f"llama.cpp: llama-server ready at {target}")
        return target
    build = root / "build"
    logs = root / "logs"
    if read_json(build / _MARKER).get("sdist") != spec["sdist"]:
        shutil.rmtree(build, ignore_errors=True)  # another version's tree
    build.mkdir(parents=True, exist_ok=True)
    source = _ensure_source(build, logs, progress)
    cmake = shutil.which("cmake")
    if cmake is None or shutil.which("c++") is None:
        raise EngineSetupError("building llama-server needs cmake and g++ (apt-get install)")
    jobs = str(os.cpu_count() or 2)
    progress(f"llama.cpp: building llama-server {LLAMACPP_VERSION} (-j{jobs}; ~20-40 min)")
    run_logged(
        [
            "nice",
            "-n",
            "10",
            cmake,
            "-S",
            str(source),
            "-B",
            str(build / "cmake-build"),
            *CMAKE_FLAGS,
        ],
        logs / "cmake-configure.log",
        what="configuring the llama.cpp build",
        timeout_s=600.0,
    )
    run_logged(
        ["nice", "-n", "10", cmake, "--build", str(build / "cmake-build"), *_TARGET, jobs],
        logs / "cmake-build.log",
        what="building llama-server",
        timeout_s=_BUILD_TIMEOUT_S,
    )
    built = build / "cmake-build" / "bin" / "llama-server"
    if not built.exists():
        raise EngineSetupError(f"the build finished but {built} is missing; see {logs}")
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(built, target)
    marker.write_text(json.dumps(spec, indent=2) + "\n")
    progress(f"llama.cpp: llama-server ready at {target}")
    return target


def _ensure_source(build: Path, logs: Path, progress: Progress) -> Path:
    """The vendored llama.cpp tree of the sdist, downloaded with pip and unpacked once."""
    source = build / f"llama_cpp_python-{LLAMACPP_VERSION}" / "vendor" / "llama.cpp"
    if (source / "tools" / "server" / "CMakeLists.txt").exists():
        return source
    progress(f"llama.cpp: downloading the {LLAMACPP_SDIST} {LLAMACPP_VERSION} source package")
    with tempfile.TemporaryDirectory(dir=build) as tmp:
        run_logged(
            [sys.executable, *_PIP_SDIST, "-d", tmp, f"{LLAMACPP_SDIST}=={LLAMACPP_VERSION}"],
            logs / "pip-download.log",
            what=f"downloading {LLAMACPP_SDIST}=={LLAMACPP_VERSION}",
            timeout_s=900.0,
        )
        (archive,) = Path(tmp).glob("*.tar.gz")
        with tarfile.open(archive) as tar:
            tar.extractall(build, filter="data")
    if not (source / "tools" / "server").is_dir():
        raise EngineSetupError(f"{LLAMACPP_SDIST} {LLAMACPP_VERSION} has no {source}")
    (build / _MARKER).write_text(json.dumps({"sdist": f"{LLAMACPP_SDIST}=={LLAMACPP_VERSION}"}))
    return source


def _ensure_model(model_dir: Path, progress: Progress) -> Path:
    script = Path(__file__).with_name("tiny_gguf.py")
    model = model_dir / "tiny.gguf"
    expected = {"script_sha256": sha256(script.read_bytes()).hexdigest(), "seed": TINY_GGUF_SEED}
    if model.exists() and read_json(model_dir / _MARKER) == expected:
        progress(f"llama.cpp: tiny GGUF model ready at {model}")
        return model
    model_dir.mkdir(parents=True, exist_ok=True)
    staging = model_dir / "tiny.gguf.tmp"
    staging.unlink(missing_ok=True)
    run_logged(
        [sys.executable, str(script), str(staging), "--seed", str(TINY_GGUF_SEED)],
        model_dir / "build.log",
        what="building the tiny GGUF model (needs the gguf package)",
        timeout_s=300.0,
    )
    staging.replace(model)
    (model_dir / _MARKER).write_text(json.dumps(expected) + "\n")
    progress(f"llama.cpp: tiny GGUF model ready at {model}")
    return model
