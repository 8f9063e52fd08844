"""docs/architecture.md says what the code is; each claim the code can check is checked here:
the two layer maps against the import contracts, every ``path.py:Name`` the request's walk
names, the record's processors and exporters in the order the walk gives, and the answer
path (one function makes outcomes, one sends the relay's answers)."""

from __future__ import annotations

import ast
import importlib
import re
import tomllib
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from obs.exporters.memory import InMemoryExporter
from obs.sidecar.app import create_app
from obs.sidecar.settings import Settings
from tests.support.inproc import lane_config

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
CONTRACTS = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"][
    "importlinter"
]["contracts"]


def _section(start: str, end: str) -> str:
    return DOC[DOC.index(start) : DOC.index(end, DOC.index(start))]


def _block(after: str) -> list[str]:
    """The lines of the first fenced block after the heading ``after``."""
    text = DOC[DOC.index(after) :]
    body = text.split("```", 2)[1]
    return body.splitlines()[1:]


def _layers(lines: list[str], column: int) -> list[str]:
    """The layers a map lists, top first: the text from ``column`` up to two spaces or a
    comment, on the lines where a layer starts there (spaces dropped, ``/`` of a package)."""
    out = []
    for line in lines:
        rest = line[column:]
        if not rest or rest[0] in " │(":
            continue
        out.append(re.split(r"\s{2,}|\(", rest)[0].replace(" ", "").replace("/", ""))
    return out


def _contract(containers: str) -> list[str]:
    layers = next(c for c in CONTRACTS if c.get("containers") == [containers])["layers"]
    return [layer.replace(" ", "") for layer in layers]


@pytest.mark.unit
def test_the_layer_map_is_the_import_contract() -> None:
    """The layer map lists obs's layers as the layers contract orders them."""
    assert _layers(_block("## The layer map"), 16) == _contract("obs")


@pytest.mark.unit
def test_the_sidecars_map_is_its_import_contract() -> None:
    """The sidecar's map lists its subpackages as its contract orders them (endings between
    policy and outcomes)."""
    assert _layers(_block("### Inside the sidecar"), 14) == _contract("obs.sidecar")


WALK = _section("## One request through the code", "## Where a new thing goes")
NAMED = sorted(set(re.findall(r"`((?:sidecar|exporters|obs)/[\w/]+\.py)(?::([\w.]+))?`", WALK)))


def _module(path: str) -> object:
    dotted = path.removesuffix(".py").replace("/", ".")
    return importlib.import_module(dotted if dotted.startswith("obs.") else "obs." + dotted)


@pytest.mark.unit
@pytest.mark.parametrize(("path", "name"), NAMED, ids=[f"{p}:{n}" for p, n in NAMED])
def test_every_module_and_name_the_walk_gives_exists(path: str, name: str) -> None:
    """Each ``path.py`` (and ``path.py:Name.attr``) the request's walk names is there."""
    assert (ROOT / path).is_file()
    obj = _module(path)
    for part in filter(None, name.split(".")):
        assert hasattr(obj, part), f"{path}:{name}"
        obj = getattr(obj, part)


@pytest.mark.unit
def test_the_walk_names_a_good_share_of_the_code() -> None:
    """The check above is not vacuous: the walk names dozens of modules and functions."""
    assert len(NAMED) >= 40


def _in_order(claimed: list[str], present: list[str]) -> None:
    """``present`` (what the code runs) is ``claimed`` (the doc's order) less what is off."""
    assert [x for x in claimed if x in present] == present, (claimed, present)


@pytest.mark.inproc
def test_processors_and_exporters_run_in_the_order_the_walk_gives(tmp_path: Path) -> None:
    """A sidecar with every exporter a setting turns on but ClickHouse, and a caller's own:
    its processors and exporters are in the walk's order (the metrics last)."""
    step7 = WALK[WALK.index("7. **Settle and record**") :]
    processors = re.findall(r"`([A-Z]\w+)`", step7[step7.index("in order:") : step7.index("Then")])
    exporting = step7[step7.index("Then the exporters") : step7.index("Once recorded")]
    exporters = [
        p.removesuffix(".py").replace("/", ".")
        for p in re.findall(r"`(exporters/\w+\.py)`", exporting)
    ]
    off = "http://127.0.0.1:9"  # nothing is sent: the app is built, never run
    settings = Settings(
        config=lane_config({"p": [off]}),
        events_path=tmp_path / "events.jsonl",
        otlp_endpoint=off,
        otlp_metrics_endpoint=off,
        otlp_logs_endpoint=off,
    )
    app = create_app(settings, registry=CollectorRegistry(), exporters=[InMemoryExporter()])
    try:
        running = [type(p).__name__ for p in app.recorder.processors]
        _in_order(processors, running)
        assert len(running) >= 6
        made = [type(x).__module__.removeprefix("obs.") for x in app.exporters.exporters]
        _in_order(exporters, made)
        assert made[-1] == "exporters.prom" and len(made) == 6
    finally:
        app.exporters.shutdown()


def _calls(rel: str, name: str) -> list[str]:
    """The functions of sidecar/``rel`` that call ``name`` (a bare name or ``x.name``)."""
    tree = ast.parse((ROOT / "sidecar" / rel).read_text(encoding="utf-8"))
    callers = []
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            for node in ast.walk(fn):
                if isinstance(node, ast.Call):
                    f = node.func
                    called = f.id if isinstance(f, ast.Name) else getattr(f, "attr", None)
                    if called == name:
                        callers.append(fn.name)
    return callers


@pytest.mark.unit
def test_the_relay_answers_every_failure_through_respond_fail() -> None:
    """The walk's answer path: ``respond.send_error`` is called by ``respond.fail`` alone,
    and the relay's catch-all, its refusals and a stream's error end all go through it."""
    relay = Path(ROOT / "sidecar" / "relay")
    senders = {
        f"{p.name}:{fn}"
        for p in relay.glob("*.py")
        for fn in _calls(f"relay/{p.name}", "send_error")
    }
    assert senders == {"respond.py:fail"}
    assert set(_calls("relay/relay.py", "fail")) == {"__call__"}
    assert set(_calls("relay/streaming.py", "fail")) == {"end_stream"}


@pytest.mark.unit
def test_the_servers_own_answers_are_outcomes() -> None:
    """The server writes its own answers in one place, from an outcome: ``answer_and_close``
    takes the outcome (refusals, a request that is none), ``_internal_error`` asks for one."""
    assert set(_calls("server/connection.py", "answer_and_close")) == {"_bad_request", "_refuse"}
    assert _calls("server/wire.py", "outcome") == ["_internal_error"]
