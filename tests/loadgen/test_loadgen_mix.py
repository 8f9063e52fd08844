"""The workload mix: the shipped default, overlays, --set overrides, and errors naming fields."""

from __future__ import annotations

from pathlib import Path

import pytest

from obs.errors import ConfigError
from obs.loadgen.mix import CLASS_NAMES, AgentSpec, RagSpec, SlowStreamSpec, load_mix, parse_mix


def test_default_mix_has_all_six_classes() -> None:
    """The shipped mix gives every class a positive weight and its own shape."""
    mix = load_mix()
    assert list(mix.weights()) == list(CLASS_NAMES)
    assert isinstance(mix.spec("rag"), RagSpec) and isinstance(mix.spec("agent"), AgentSpec)
    assert isinstance(mix.spec("slow-stream"), SlowStreamSpec)
    assert mix.spec("batch").stream is False
    assert all(mix.spec(c).stream for c in CLASS_NAMES if c != "batch")


def test_header_value_is_the_class_name_unless_overridden() -> None:
    """X-Client-Class defaults to the class name; client_class overrides it."""
    mix = load_mix(sets=["slow-stream.client_class=slow"])
    assert [mix.header_value(c) for c in CLASS_NAMES[:5]] == list(CLASS_NAMES[:5])
    assert mix.header_value("slow-stream") == "slow"


def test_user_mix_overlays_defaults_and_drops_unlisted_classes(tmp_path: Path) -> None:
    """A mix file's fields replace the defaults; classes it leaves out get weight 0."""
    f = tmp_path / "mix.yaml"
    f.write_text("classes:\n  rag: {weight: 3, documents: 2}\n  chat: {max_tokens: 9}\n")
    mix = load_mix(f)
    assert mix.weights() == {"chat": 40, "rag": 3}
    assert mix.classes.rag.documents == 2
    assert mix.classes.rag.document_tokens == load_mix().classes.rag.document_tokens
    assert mix.spec("chat").max_tokens == (9, 9)


def test_set_overrides_apply_last_and_parse_yaml_values() -> None:
    """--set takes CLASS.FIELD=VALUE (or request.FIELD) with YAML values, ranges included."""
    mix = load_mix(sets=["chat.weight=5", "rag.max_tokens=[16, 32]", "request.ignore_eos=false"])
    assert mix.weights()["chat"] == 5
    assert mix.spec("rag").max_tokens == (16, 32)
    assert mix.request.ignore_eos is False


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["chat.wieght=5"], "classes.chat.wieght: unknown key"),
        (["chat.max_tokens=[32, 16]"], "classes.chat.max_tokens: range [32, 16] has min > max"),
        (["chat.prompt_tokens=0"], "classes.chat.prompt_tokens"),
        (["bogus.weight=1"], "classes.bogus: unknown key"),
        (["slow-stream.read_events_per_s=5"], "give exactly one of read_bytes_per_s"),
        (["slow-stream.stream=false"], "classes.slow-stream: stream must be true"),
        ([f"{c}.weight=0" for c in CLASS_NAMES], "every class has weight 0"),
        (["chat.weight=-1"], "classes.chat.weight"),
    ],
)
def test_bad_mix_errors_name_the_field(sets: list[str], message: str) -> None:
    """Invalid mixes raise ConfigError naming the source and the field."""
    with pytest.raises(ConfigError, match="with --set") as info:
        load_mix(sets=sets)
    assert message in str(info.value)


def test_bad_set_syntax_is_reported() -> None:
    """A --set without '=' or without a field names the bad item."""
    with pytest.raises(ConfigError, match=r"expected CLASS\.FIELD=VALUE"):
        load_mix(sets=["chat.weight"])
    with pytest.raises(ConfigError, match=r"expected CLASS\.FIELD=VALUE"):
        load_mix(sets=["chat=5"])


def test_mix_file_errors_name_the_file(tmp_path: Path) -> None:
    """A missing file, bad YAML or a non-mapping names the file."""
    with pytest.raises(ConfigError, match="cannot read mix"):
        load_mix(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("classes: [\n")
    with pytest.raises(ConfigError, match=f"{bad}: not valid YAML"):
        load_mix(bad)
    bad.write_text("- 1\n")
    with pytest.raises(ConfigError, match=f"{bad}: a mix is a mapping"):
        load_mix(bad)


def test_parse_mix_requires_complete_data() -> None:
    """parse_mix validates complete data: a missing field is named."""
    with pytest.raises(ConfigError, match="classes: Field required"):
        parse_mix({"version": 1, "request": {}}, "m.yaml")


def test_shipped_lanes_route_each_class_to_its_own_lane() -> None:
    """The shipped lanes config matches every class's X-Client-Class to the lane of that name."""
    from obs.config import default_config_path, load_config

    config = load_config(default_config_path())
    mix = load_mix()
    for name in CLASS_NAMES:
        headers = [m.header or {} for m in config.lane(name).match]
        assert {"x-client-class": mix.header_value(name)} in headers, name


def test_package_exports_resolve_lazily() -> None:
    """Every name in obs.loadgen.__all__ resolves to the object, not a submodule."""
    import types

    import obs.loadgen

    for name in obs.loadgen.__all__:
        assert not isinstance(getattr(obs.loadgen, name), types.ModuleType), name
