"""Synthetic prompt text: planned lengths, determinism, and shared prefixes where they recur."""

from __future__ import annotations

import importlib.util
import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from obs.errors import ConfigError
from obs.loadgen.mix import CLASS_NAMES, load_mix
from obs.loadgen.plan import Arrivals, PlannedRequest, plan, sessions
from obs.loadgen.prompts import VOCABULARY, CharEstimate, HFTokenizer, PromptBuilder, words

HAVE_TOKENIZERS = importlib.util.find_spec("tokenizers") is not None


def _req(cls: str, **kw: object) -> PlannedRequest:
    base: dict[str, Any] = dict(
        index=0, client_class=cls, session=0, turn=0, offset_s=0.0, think_s=0.0,
        prompt_tokens=50, max_tokens=8, stream=True,
    )  # fmt: skip
    base.update(kw)
    return PlannedRequest(**base)


def test_words_are_deterministic_and_extend_a_shorter_call() -> None:
    """The same key gives the same words; a longer call starts with the shorter one's text."""
    short, long = words("k", 100), words("k", 1000)
    assert words("k", 100) == short and long.startswith(short) and words("j", 100) != short
    assert set(long.split()) <= set(VOCABULARY)


def test_char_estimate_gives_four_characters_per_token() -> None:
    """Without a tokenizer a 100-token text is about 400 characters."""
    sizer = CharEstimate()
    assert 395 <= len(sizer.fit("x", 100)) <= 400
    assert "4 characters per token" in sizer.description
    with pytest.raises(ConfigError):
        CharEstimate(0)


def test_chat_prompt_is_one_user_message_unique_per_session() -> None:
    """Chat requests of different sessions get different text of the planned size."""
    b = PromptBuilder(CharEstimate(), "salt")
    one, two = b.messages(_req("chat")), b.messages(_req("chat", session=1))
    assert [m["role"] for m in one] == ["user"] and one != two
    assert 190 <= len(one[0]["content"]) <= 200
    assert PromptBuilder(CharEstimate(), "salt").messages(_req("chat")) == one
    assert PromptBuilder(CharEstimate(), "other").messages(_req("chat")) != one


def test_rag_requests_on_one_document_share_the_prefix() -> None:
    """Two rag requests on the same document send the same system message, different questions."""
    b = PromptBuilder(CharEstimate(), "s")
    a = b.messages(_req("rag", document=1, prefix_tokens=300, prompt_tokens=10))
    c = b.messages(_req("rag", session=5, document=1, prefix_tokens=300, prompt_tokens=10))
    d = b.messages(_req("rag", session=6, document=2, prefix_tokens=300, prompt_tokens=10))
    assert a[0] == c[0] and a[0]["role"] == "system" and len(a[0]["content"]) > 1200
    assert a[1] != c[1] and a[0] != d[0]


def test_agent_turn_messages_extend_the_previous_turns() -> None:
    """Each planned agent turn's messages start with the previous turn's messages."""
    mix = load_mix(sets=[f"{c}.weight=0" for c in CLASS_NAMES if c != "agent"])
    turns = next(sessions(plan(mix, 3, Arrivals(rate=1), max_requests=20)))
    b = PromptBuilder(CharEstimate(), "s")
    msgs = [b.messages(t) for t in turns]
    assert len(turns) >= 3
    for prev, nxt in itertools.pairwise(msgs):
        assert nxt[: len(prev)] == prev and [m["role"] for m in nxt[len(prev) :]] == [
            "assistant",
            "user",
        ]


def test_batch_prompt_asks_for_a_summary() -> None:
    """Batch prompts start with a summarization instruction."""
    msgs = PromptBuilder(CharEstimate(), "s").messages(_req("batch"))
    assert msgs[0]["content"].startswith("Summarize this text.")


@pytest.mark.skipif(HAVE_TOKENIZERS, reason="the tokenizers package is installed")
def test_tokenizer_without_the_package_is_a_config_error(tmp_path: Path) -> None:
    """--tokenizer without the optional tokenizers package says how to fix it."""
    with pytest.raises(ConfigError, match="pip install tokenizers"):
        HFTokenizer(tmp_path)


@pytest.mark.skipif(not HAVE_TOKENIZERS, reason="needs the optional tokenizers package")
def test_tokenizer_cuts_text_to_exact_token_counts(tmp_path: Path) -> None:
    """With a tokenizer.json, fitted text encodes to exactly the planned token count."""
    vocab = {w: i for i, w in enumerate(["[UNK]", *VOCABULARY])}
    spec = {
        "version": "1.0",
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"},
        "pre_tokenizer": {"type": "Whitespace"},
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": False},
    }
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    tok = HFTokenizer(tmp_path)
    for n in (1, 17, 300):
        assert tok.count(tok.fit("k", n)) == n
    with pytest.raises(ConfigError, match="not found"):
        HFTokenizer(tmp_path / "missing")
