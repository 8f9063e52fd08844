"""Is an answer JSON? Checked incrementally, as its text streams, without keeping the text.

:class:`JsonCheck` is a pushdown automaton for one JSON text (RFC 8259: one value with
whitespace around it). ``feed`` takes each piece of the answer as it arrives (a stream
delta, any split, even inside a string escape or a number); ``valid`` says at the end
whether the whole text parses. Memory is bounded: the state is a few integers and the
stack of open containers, capped at ``MAX_DEPTH`` (deeper nesting counts as not valid),
so a long or hostile answer costs no more than a short one. Once invalid, it stays
invalid and ignores the rest.

It accepts exactly what ``json.loads`` accepts, except the non-standard ``NaN``,
``Infinity`` and ``-Infinity`` (not JSON) and nesting deeper than ``MAX_DEPTH``.

:class:`ValueCount` bounds how many values a JSON text (a request body) can hold before
anyone parses it: the commas and object openers outside strings, fed in slices of bytes.
A comma inside a string is text, not a value (a 500 KB prose field with 250,000 commas
holds one value); the work is done by ``re`` and ``bytes.count`` in C.
"""

from __future__ import annotations

import re
from typing import Final

MAX_DEPTH: Final = 256
_WS: Final = frozenset(" \t\n\r")
_DIGITS: Final = frozenset("0123456789")
_HEX: Final = frozenset("0123456789abcdefABCDEF")
_ESCAPES: Final = frozenset('"\\/bfnrt')
_LITERALS: Final = {"t": "rue", "f": "alse", "n": "ull"}

# States.
_VALUE = 0  # a value must come (start, after ':' or ',' in an array)
_VALUE_OR_CLOSE = 1  # after '[': a value or ']'
_KEY_OR_CLOSE = 2  # after '{': a key or '}'
_KEY = 3  # after ',' in an object: a key
_COLON = 4  # after a key
_AFTER = 5  # after a value: ',' or the container's close, or the end at top level
_STRING = 6
_ESCAPE = 7
_UNICODE = 8  # ``_left`` hex digits to go
_LITERAL = 9  # ``_word`` still to read
_NUMBER = 10  # ``_num`` says where in the number
_ERROR = 11

# Number positions: after '-', after a leading 0, in the integer digits, after '.',
# in the fraction, after 'e', after the exponent's sign, in the exponent digits.
_N_SIGN, _N_ZERO, _N_INT, _N_DOT, _N_FRAC, _N_E, _N_ESIGN, _N_EXP = range(8)
_N_DONE: Final = frozenset({_N_ZERO, _N_INT, _N_FRAC, _N_EXP})  # a number may end here


class JsonCheck:
    """Feed an answer's text piece by piece; ``valid`` at the end says if it is JSON."""

    __slots__ = ("_is_key", "_left", "_num", "_stack", "_state", "_word", "chars")

    def __init__(self) -> None:
        self._state = _VALUE
        self._stack: list[str] = []  # '{' or '[' per open container
        self._is_key = False
        self._left = 0
        self._word = ""
        self._num = 0
        self.chars = 0  # characters fed (counted, not kept)

    @property
    def failed(self) -> bool:
        """Already not JSON, whatever comes next."""
        return self._state == _ERROR

    @property
    def valid(self) -> bool:
        """Whether everything fed so far is one complete JSON text."""
        if self._stack:
            return False
        if self._state == _AFTER:
            return True
        return self._state == _NUMBER and self._num in _N_DONE

    def feed(self, text: str) -> None:
        """Read the next piece of the answer."""
        self.chars += len(text)
        for ch in text:
            if self._state == _ERROR:
                return
            self._step(ch)

    def _step(self, ch: str) -> None:
        s = self._state
        if s == _STRING:
            if ch == '"':
                self._state = _COLON if self._is_key else _AFTER
            elif ch == "\\":
                self._state = _ESCAPE
            elif ch < " ":
                self._state = _ERROR
        elif s == _ESCAPE:
            if ch == "u":
                self._state, self._left = _UNICODE, 4
            else:
                self._state = _STRING if ch in _ESCAPES else _ERROR
        elif s == _UNICODE:
            if ch not in _HEX:
                self._state = _ERROR
            else:
                self._left -= 1
                if not self._left:
                    self._state = _STRING
        elif s == _NUMBER:
            if not self._number(ch):
                if self._num not in _N_DONE:
                    self._state = _ERROR
                else:
                    self._state = _AFTER
                    self._step(ch)
        elif s == _LITERAL:
            if ch != self._word[0]:
                self._state = _ERROR
            else:
                self._word = self._word[1:]
                if not self._word:
                    self._state = _AFTER
        elif ch in _WS:
            return
        elif s in (_VALUE, _VALUE_OR_CLOSE):
            if s == _VALUE_OR_CLOSE and ch == "]":
                self._close("[")
            else:
                self._value(ch)
        elif s in (_KEY_OR_CLOSE, _KEY):
            if ch == '"':
                self._state, self._is_key = _STRING, True
            elif s == _KEY_OR_CLOSE and ch == "}":
                self._close("{")
            else:
                self._state = _ERROR
        elif s == _COLON:
            self._state = _VALUE if ch == ":" else _ERROR
        elif s == _AFTER:
            self._after(ch)

    def _value(self, ch: str) -> None:
        if ch == '"':
            self._state, self._is_key = _STRING, False
        elif ch in "{[":
            if len(self._stack) >= MAX_DEPTH:
                self._state = _ERROR
                return
            self._stack.append(ch)
            self._state = _KEY_OR_CLOSE if ch == "{" else _VALUE_OR_CLOSE
        elif ch in _LITERALS:
            self._state, self._word = _LITERAL, _LITERALS[ch]
        elif ch == "-" or ch in _DIGITS:
            self._state = _NUMBER
            self._num = _N_SIGN if ch == "-" else _N_ZERO if ch == "0" else _N_INT
        else:
            self._state = _ERROR

    def _after(self, ch: str) -> None:
        if not self._stack:
            self._state = _ERROR  # anything but whitespace after the top-level value
        elif ch == ",":
            self._state = _KEY if self._stack[-1] == "{" else _VALUE
        elif ch in "]}":
            self._close("[" if ch == "]" else "{")
        else:
            self._state = _ERROR

    def _close(self, opener: str) -> None:
        if not self._stack or self._stack[-1] != opener:
            self._state = _ERROR
        else:
            self._stack.pop()
            self._state = _AFTER

    def _number(self, ch: str) -> bool:
        """Advance inside a number; False when ``ch`` is not part of it."""
        n, digit = self._num, ch in _DIGITS
        if n == _N_SIGN:
            nxt = _N_ZERO if ch == "0" else _N_INT if digit else None
        elif n in (_N_ZERO, _N_INT):
            if digit:
                nxt = _N_INT if n == _N_INT else None
                if nxt is None:  # a digit after a leading zero
                    self._state = _ERROR
                    return True
            else:
                nxt = _N_DOT if ch == "." else _N_E if ch in "eE" else None
        elif n in (_N_DOT, _N_FRAC):
            nxt = _N_FRAC if digit else (_N_E if n == _N_FRAC and ch in "eE" else None)
        elif n == _N_E:
            nxt = _N_ESIGN if ch in "+-" else _N_EXP if digit else None
        else:  # _N_ESIGN, _N_EXP
            nxt = _N_EXP if digit else None
        if nxt is None:
            return False
        self._num = nxt
        return True


# A string from its opening quote to its closing one, or to the end of the piece when it
# does not close there; and the rest of a string already open, up to its closing quote.
# Possessive: each match attempt is linear and consumes, so hostile input (a million escaped
# quotes) costs one pass.
_STRING_RE: Final = re.compile(rb'"[^"\\]*+(?:\\.[^"\\]*+)*+(?:"|\\?\Z)', re.DOTALL)
_STRING_REST: Final = re.compile(rb'[^"\\]*+(?:\\.[^"\\]*+)*+"', re.DOTALL)
# Appended to a piece: the NUL stays outside strings only when the piece ended outside one
# (inside, it is text and the quote closes the string).
_PROBE: Final = b'\x00"'


def _odd_backslashes_at_end(data: bytes) -> bool:
    return (len(data) - len(data.rstrip(b"\\"))) % 2 == 1


class ValueCount:
    """Feed a JSON text's bytes in pieces; ``values`` is an upper bound on the values it holds.

    Counts each comma and ``{`` outside strings (every value of a container but the first
    follows a comma; an object's first value follows its ``{``). A piece may end anywhere,
    inside a string or an escape. Counting is C-speed: strings are cut out by a regular
    expression, what is left is counted with ``bytes.count``. A raw NUL byte (never in
    JSON) switches to counting every comma and ``{``: still an upper bound.
    """

    __slots__ = ("_escaped", "_in_string", "_plain", "values")

    def __init__(self) -> None:
        self.values = 0
        self._in_string = False
        self._escaped = False  # the last piece ended inside a string on a lone backslash
        self._plain = False  # a NUL was seen: count everything

    def feed(self, part: bytes) -> int:
        """Count ``part``; returns the total so far."""
        if not part:
            return self.values
        if self._plain or b"\x00" in part:
            self._plain = True
            self.values += part.count(b",") + part.count(b"{")
            return self.values
        if self._in_string:
            if self._escaped:
                part, self._escaped = part[1:], False
            rest = _STRING_REST.match(part)
            if rest is None:  # the string goes on past this piece
                self._escaped = _odd_backslashes_at_end(part)
                return self.values
            part, self._in_string = part[rest.end() :], False
        outside = _STRING_RE.sub(b"", part + _PROBE)
        if outside.endswith(b"\x00"):
            outside = outside[:-1]
        else:  # a string opens and does not close in this piece
            self._in_string = True
            self._escaped = _odd_backslashes_at_end(part)
        self.values += outside.count(b",") + outside.count(b"{")
        return self.values
