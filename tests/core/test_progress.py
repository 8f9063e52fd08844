"""The one progress line: in place on a terminal, periodic lines or nothing elsewhere."""

from __future__ import annotations

import io

from obs.progress import REDRAW, ProgressLine


def test_in_place_redraws_at_most_every_interval_and_ends_with_a_newline() -> None:
    """On a terminal a draw within the interval is skipped (unless forced); end() moves below."""
    now = [0.0]
    out = io.StringIO()
    line = ProgressLine(out, in_place=True, interval_s=1.0, clock=lambda: now[0])
    line.draw("a")
    line.draw("b")  # too soon
    line.draw("c", force=True)
    now[0] = 1.5
    line.draw("d")
    line.end()
    assert out.getvalue() == f"{REDRAW}a{REDRAW}c{REDRAW}d\n"


def test_final_draw_ends_the_line_and_clear_erases_it() -> None:
    """A final draw ends the in-place line itself; clear() erases a line still on screen."""
    out = io.StringIO()
    line = ProgressLine(out, in_place=True)
    line.draw("x", final=True)
    line.end()  # already ended: nothing more
    assert out.getvalue() == f"{REDRAW}x\n"
    erased = io.StringIO()
    other = ProgressLine(erased, in_place=True)
    other.clear()  # nothing drawn: nothing to erase
    other.draw("y")
    other.clear()
    assert erased.getvalue() == f"{REDRAW}y{REDRAW}"


def test_off_a_terminal_a_line_every_period_or_nothing() -> None:
    """Without a terminal: a full line per period and a final one; no period means silence."""
    now = [0.0]
    out = io.StringIO()
    line = ProgressLine(out, in_place=False, every_s=10.0, clock=lambda: now[0])
    line.draw("early")
    now[0] = 10.0
    line.draw("ten")
    line.draw("last", final=True)
    assert out.getvalue() == "ten\nlast\n"
    silent = io.StringIO()
    quiet = ProgressLine(silent, in_place=False)
    quiet.draw("z", final=True)
    assert silent.getvalue() == "" and not quiet.enabled and line.enabled
