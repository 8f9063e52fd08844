"""``cache_root``: each vLLM start gets its own cache root, sharing only vLLM's model-inspection
cache (``modelinfos``) under the engine home, so a start after the first skips inspecting the
model in a fresh interpreter. Directories only: no engine is started here."""

from __future__ import annotations

from pathlib import Path

from obs.engines.server import MODELINFOS, cache_root


def test_starts_have_their_own_roots_and_share_modelinfos(tmp_path: Path) -> None:
    """Two starts' roots differ; what one writes to modelinfos the other reads, and outlives it."""
    home = tmp_path / "home"
    first = cache_root(tmp_path / "run1", home)
    second = cache_root(tmp_path / "run2", home)

    assert first != second and first.is_dir() and second.is_dir()
    (first / MODELINFOS / "llama.json").write_text("{}")
    assert (second / MODELINFOS / "llama.json").read_text() == "{}"
    (first / "other").mkdir()  # anything else vLLM writes stays the start's own
    assert not (second / "other").exists()
    assert (home / "vllm-cache" / MODELINFOS / "llama.json").exists()


def test_a_home_that_cannot_hold_the_cache_leaves_a_plain_root(tmp_path: Path) -> None:
    """A file where the shared cache's directory would go: the root is made, without the link."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "vllm-cache").write_text("not a directory")

    root = cache_root(tmp_path / "run", home)

    assert root.is_dir() and not (root / MODELINFOS).exists()
