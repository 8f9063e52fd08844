"""Synthetic prompt text of a planned length, and the chat messages of a request.

Text is words drawn from a fixed vocabulary by a random stream keyed on a salt
and the text's role (request, document, conversation turn), so the same key
always gives the same text: rag documents and an agent conversation's earlier
turns are byte-identical wherever they recur, which is what lets the server's
prefix cache hit. The driver salts with the seed and the run id, so a new run
starts with a cold cache and the same run id reproduces the same text.

Lengths are tokens. With a tokenizer (``HFTokenizer``, a ``tokenizer.json``
read by the optional ``tokenizers`` package) the text is cut to exactly that
many tokens; without one, ``CharEstimate`` assumes 4 characters per token.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Protocol

from obs.errors import ConfigError
from obs.loadgen.plan import PlannedRequest

_WORDS = """
    the of and to in is was for that on as with by at from it an be this which or are
    have not had has but were they their one all there been more when will would who
    can other time first after also new some these two may into only over such most
    used year city made world could between during many under then later state system
    known both through where part while people group high each well number found three
    being under before since than same out long about small large early work life
    water house point order place light power market field value model data report
    table river north south east west center paper service music family school court
    energy region survey method result answer question reason summary process engine
    request server client stream token cache prefix memory network signal window
    garden forest island valley mountain harbor bridge station village market library
    morning evening winter summer spring autumn yellow green silver purple orange
    simple quiet rapid gentle narrow broad steady careful honest modern ancient
    measure follow gather carry build open close choose begin finish explain compare
"""
VOCABULARY = tuple(dict.fromkeys(_WORDS.split()))

DEFAULT_CHARS_PER_TOKEN = 4.0


class Sizer(Protocol):
    """Cuts generated text to a token length."""

    description: str

    def fit(self, key: str, tokens: int) -> str:
        """Text of about ``tokens`` tokens, the same for the same ``key``."""
        ...


def words(key: str, chars: int) -> str:
    """At least ``chars`` characters of words; a longer call extends a shorter one's text."""
    rng = random.Random(key)
    out: list[str] = []
    n = 0
    while n < chars:
        w = VOCABULARY[rng.randrange(len(VOCABULARY))]
        out.append(w)
        n += len(w) + 1
    return " ".join(out)


class CharEstimate:
    """No tokenizer: about ``chars_per_token`` characters per token (4 by default)."""

    def __init__(self, chars_per_token: float = DEFAULT_CHARS_PER_TOKEN) -> None:
        if chars_per_token <= 0:
            raise ConfigError(f"chars_per_token must be positive, got {chars_per_token}")
        self.chars_per_token = chars_per_token
        self.description = f"estimated at {chars_per_token:g} characters per token"

    def fit(self, key: str, tokens: int) -> str:
        chars = max(1, round(tokens * self.chars_per_token))
        return words(key, chars)[:chars].rstrip()


class HFTokenizer:
    """Exact token counts from a Hugging Face ``tokenizer.json`` (needs ``tokenizers``)."""

    def __init__(self, directory: str | Path) -> None:
        path = Path(directory)
        if path.is_dir():
            path = path / "tokenizer.json"
        try:
            from tokenizers import Tokenizer
        except ImportError as e:
            raise ConfigError(
                "--tokenizer: the 'tokenizers' package is not installed "
                "(pip install tokenizers), or leave --tokenizer out to estimate lengths"
            ) from e
        if not path.is_file():
            raise ConfigError(f"--tokenizer: {path} not found (a directory with tokenizer.json)")
        try:
            self._tok: Any = Tokenizer.from_file(str(path))
        except Exception as e:  # the Rust side raises plain Exception
            raise ConfigError(f"--tokenizer: cannot load {path}: {e}") from e
        self.description = f"counted with {path}"

    def fit(self, key: str, tokens: int) -> str:
        chars = tokens * 6
        while True:
            ids = self._tok.encode(words(key, chars), add_special_tokens=False).ids
            if len(ids) >= tokens:
                text: str = self._tok.decode(ids[:tokens])
                return text
            chars *= 2

    def count(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=False).ids)


class PromptBuilder:
    """Chat messages for planned requests; text keyed on ``salt`` and the text's role."""

    def __init__(self, sizer: Sizer, salt: str) -> None:
        self._sizer = sizer
        self._salt = salt
        self._documents: dict[int, str] = {}

    def text(self, role: str, tokens: int) -> str:
        return self._sizer.fit(f"{self._salt}/{role}", tokens)

    def document(self, number: int, tokens: int) -> str:
        if number not in self._documents:
            self._documents[number] = self.text(f"document/{number}", tokens)
        return self._documents[number]

    def messages(self, req: PlannedRequest) -> list[dict[str, str]]:
        """The ``messages`` of the request's chat completion."""
        own = f"session/{req.session}/turn/{req.turn}/user"
        if req.client_class == "rag" and req.document is not None:
            doc = self.document(req.document, req.prefix_tokens)
            return [
                {"role": "system", "content": "Answer from this document.\n\n" + doc},
                {"role": "user", "content": self.text(own, req.prompt_tokens)},
            ]
        if req.client_class == "agent":
            msgs = [
                {
                    "role": "system",
                    "content": self.text(f"session/{req.session}/context", req.prefix_tokens),
                }
            ]
            for turn, (user, assistant) in enumerate(req.history):
                base = f"session/{req.session}/turn/{turn}"
                msgs.append({"role": "user", "content": self.text(f"{base}/user", user)})
                msgs.append(
                    {"role": "assistant", "content": self.text(f"{base}/assistant", assistant)}
                )
            msgs.append({"role": "user", "content": self.text(own, req.prompt_tokens)})
            return msgs
        prefix = "Summarize this text.\n\n" if req.client_class == "batch" else ""
        return [{"role": "user", "content": prefix + self.text(own, req.prompt_tokens)}]
