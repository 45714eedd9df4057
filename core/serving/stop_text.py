"""An answer's text as its tokens arrive: decoded a few tokens at a time and cut at its first stop string.

Both cost the same at every token however long the answer grows. `IncrementalDecoder` decodes only
the tokens since the last piece of finished text, as vLLM's and TGI's detokenizers do (a token that
ends inside a UTF-8 character waits for the next one). `StopText` scans only the new piece and the
few characters held back before it (fewer than the longest stop string), never the whole answer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

REPLACEMENT = "\ufffd"  # what a decoder writes for bytes that do not (yet) make a character


class IncrementalDecoder:
    """The text of a growing list of token ids, handed out in pieces that add up to `decode(ids)`.

    Only a window of the latest tokens is decoded at each push: once its text ends in a whole
    character and it holds more than `WINDOW` tokens (or, whatever its end, `LONGEST_RUN`), it restarts
    from its last `CONTEXT` tokens, kept so that a tokenizer which writes a word's leading space from its
    neighbour still sees one. Text that ends in replacement characters waits: they may be a character
    still being written, byte by byte (a byte-fallback decoder shows every byte of its run that way
    until the character is whole). Once `BYTES` tokens have passed without a whole character, the bytes
    are not one: all but the last three replacement characters are handed out as they are.
    """

    WINDOW, CONTEXT, LONGEST_RUN, BYTES = 8, 4, 64, 4

    def __init__(self, decode: Callable[[Sequence[int]], str]) -> None:
        self.decode = decode
        self.ids: list[int] = []
        self.start = 0  # where the decoded window begins
        self.emitted = 0  # characters of the window's text already handed out
        self.whole_at = 0  # how many ids there were when the text last ended in a whole character

    def push(self, token: int) -> str:
        """The text `token` finishes ("" while it only begins a character)."""
        self.ids.append(token)
        text = self.decode(self.ids[self.start:])
        settled = self._settled(text)
        piece = text[self.emitted:settled]
        self.emitted = max(self.emitted, settled)
        window = len(self.ids) - self.start
        if window > self.LONGEST_RUN or (window > self.WINDOW and self.whole_at == len(self.ids)):
            self.start = len(self.ids) - self.CONTEXT
            held = len(text) - self.emitted  # the window's held end, which the new window ends with too
            self.emitted = max(len(self.decode(self.ids[self.start:])) - held, 0)
        return piece

    def _settled(self, text: str) -> int:
        """How much of `text` no later token can change."""
        unfinished = len(text) - len(text.rstrip(REPLACEMENT))
        if not unfinished:
            self.whole_at = len(self.ids)
            return len(text)
        if len(self.ids) - self.whole_at >= self.BYTES:
            return len(text) - min(unfinished, self.BYTES - 1)
        return len(text) - unfinished


class StopText:
    """Text passed on to `write` as it arrives, cut at the first stop string; text that could begin a
    stop string is held back until it cannot."""

    def __init__(self, stops: Sequence[str], write: Callable[[str], None]) -> None:
        self.stops, self.write = tuple(stops), write
        self.held = ""
        """The unsent end of the text: shorter than the longest stop string."""
        self.sent: list[str] = []
        self.stopped = False

    def feed(self, piece: str) -> bool:
        """Take the next piece of text; True once the text holds a stop string (later pieces are ignored)."""
        if self.stopped or not piece:
            return self.stopped
        window = self.held + piece
        cut = self._first_stop(window)
        if cut is not None:
            self.stopped, self.held = True, ""
            self._send(window[:cut])
            return True
        keep = self._could_begin_stop(window)
        self.held = window[len(window) - keep:] if keep else ""
        self._send(window[:len(window) - keep])
        return False

    def finish(self, full: str) -> str:
        """The whole answer, cut; `full` is the decoded ids, which the pieces fed add up to (when the two
        differ, as a tokenizer's clean-up of spaces can make them, the pieces already sent win)."""
        sent = "".join(self.sent)
        if not self.stopped:
            rest = full[len(sent):] if full.startswith(sent) else self.held
            cut = self._first_stop(rest)
            self.stopped, self.held = cut is not None, ""
            self._send(rest if cut is None else rest[:cut])
        return "".join(self.sent)

    def _first_stop(self, text: str) -> int | None:
        found = [at for at in (text.find(stop) for stop in self.stops) if at >= 0]
        return min(found) if found else None

    def _could_begin_stop(self, text: str) -> int:
        """How many trailing characters of `text` could be the start of a stop string."""
        return max((k for stop in self.stops for k in range(1, min(len(stop), len(text) + 1)) if text.endswith(stop[:k])),
                   default=0)

    def _send(self, text: str) -> None:
        if text:
            self.sent.append(text)
            self.write(text)
