"""The relay written plainly, for the relay's property tests: cut each read into frames, then
decode and meter each frame alone (`test_relay_reads`, `test_relay_frames`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from fleet_core.gateway.edge.wire import StreamChunk, Usage

__all__ = ["Reference"]


def _data(frame: bytes) -> bytes | None:
    for line in frame.split(b"\n"):
        if line.startswith(b"data:"):
            return line[5:].strip()
    return None


@dataclass
class Reference:
    """The relay written plainly: cut each read into frames, decode and meter each alone.
    Asked to strip usage, it removes from each frame that decodes the ``"usage":null`` that is
    its JSON's last member, or else its first."""

    strip_usage: bool
    partial: bytes = b""
    text: list[str] = field(default_factory=list)
    usage: Usage | None = None
    done: bool = False
    ended_choices: int = 0

    def feed(self, data: bytes) -> bytes:
        buffer = (self.partial + data).replace(b"\r\n", b"\n")
        *frames, self.partial = buffer.split(b"\n\n")
        sent = (self._frame(frame + b"\n\n") for frame in frames)
        return b"".join(frame for frame in sent if frame is not None)

    def _frame(self, frame: bytes) -> bytes | None:
        payload = _data(frame)
        if payload == b"[DONE]":
            self.done = True
        if payload is None or payload == b"[DONE]":
            return frame
        try:
            chunk = msgspec.json.decode(payload, type=StreamChunk)
        except msgspec.DecodeError:
            return frame
        if chunk.usage is not None:
            self.usage = chunk.usage
            if not chunk.choices:
                return None if self.strip_usage else frame
        for choice in chunk.choices:
            for part in (choice.delta, choice.message):
                if part is not None:
                    self.text.append(part.generated())
            self.text.append(choice.text or "")
            self.ended_choices += bool(choice.finish_reason)
        if not self.strip_usage:
            return frame
        if payload.endswith(b',"usage":null}'):  # its last member, else its first
            return frame.replace(payload, payload[:-14] + b"}", 1)
        if payload.startswith(b'{"usage":null,'):
            return frame.replace(payload, b"{" + payload[14:], 1)
        return frame
