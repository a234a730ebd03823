"""Text from models, tools and datasets made safe for a terminal: control characters are shown,
never obeyed.

Generated text and tool output can hold escape sequences (``\\x1b[2J`` clears the screen, an OSC
``\\x1b]0;...\\x07`` retitles the window, a C1 ``\\x9b`` starts a CSI on some terminals). Rich
strips only a few controls (BEL, BS, VT, FF, CR) and passes ESC through, so every string that
did not come from our own code goes through `escape_controls` before it is printed. This is the
one place that rule lives.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text

__all__ = ["escape_controls", "plain"]

_KEPT = frozenset("\n\t")
_ESCAPES = {
    code: f"\\x{code:02x}"
    for code in (*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0))
    if chr(code) not in _KEPT
}


def escape_controls(text: str) -> str:
    """``text`` with every C0 and C1 control character and DEL written as a visible ``\\xNN``.

    Newline and tab are kept: they lay text out and cannot drive the terminal.
    """
    return text.translate(_ESCAPES)


def plain(value: Any, style: str = "") -> Text:
    """``value`` as rich `Text` with its controls escaped and no markup parsed (``[red]`` in a
    row id stays literal; a bare string given to a table or panel title would be markup)."""
    return Text("" if value is None else escape_controls(str(value)), style=style)
