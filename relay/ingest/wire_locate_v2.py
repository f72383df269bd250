"""Where an RW 2.0 body is malformed as protobuf's parser (upb) reads it: ``locate_v2``.

The walker of relay.ingest.wire_locate's schema for ``io.prometheus.write.v2.Request`` (see that
module for the rules each dialect follows, the paths and the offsets). The top-level fields go to
protobuf's parser in runs first, and only from the first run it refuses is the body walked field
by field (a 5 MB body refused at its end: about 0.5 s).
"""

from __future__ import annotations

from google.protobuf.message import DecodeError

from relay.ingest.wire_locate import (
    _LEN,
    _MAX_DEPTH,
    _UPB_DEPTH,
    Location,
    _Field,
    _Found,
    _indexed,
    _Node,
    _schema,
    _utf8,
)
from relay.proto import remote_v2_pb2

__all__ = ["locate_v2"]


# ---- the walk ------------------------------------------------------------------------


_CHUNK = 256  # top-level fields handed to protobuf's parser at once by ``_V2.first_suspect``


class _V2:
    """In byte order, as upb reads."""

    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.negatives: dict[str, tuple[int, int]] = {}  # path -> (offset, value as int32), the last one read

    def first_suspect(self, node: _Node) -> tuple[int, dict[int, int]]:
        """Where the walk of the top level must begin, and the elements of each field before it:
        the top-level fields are framed, then handed to protobuf's parser ``_CHUNK`` at a time (a run
        of whole fields parses alone as it does in the request: the same depth), so a long body
        costs one light pass and a Python walk from the first run that protobuf or the relay refuses."""
        buf = self.buf
        n = len(buf)
        starts: list[int] = []
        elements: list[int] = []  # the field number of an element of a known field, else 0
        pos = 0
        try:
            while pos < n:
                number, wire_type, after = self.tag(pos, n, node.name)
                end = self.skip(after, n, wire_type, number, node.name, pos, 0)
                f = node.fields.get(number)
                starts.append(pos)
                elements.append(number if f is not None and wire_type == f.wire_type else 0)
                pos = end
        except _Found:
            pass  # the walk finds it again, from the last run that parses
        starts.append(pos)
        i = 0
        while i + 1 < len(starts):
            j = min(i + _CHUNK, len(starts) - 1)
            if not _sound_v2(buf[starts[i]:starts[j]]):
                i = next((k for k in range(i, j) if not _sound_v2(buf[starts[k]:starts[k + 1]])), i)
                break
            i = j
        counts: dict[int, int] = {}
        for number in elements[:i]:  # the elements before it (a Request's fields: strings and messages)
            if number:
                counts[number] = counts.get(number, 0) + 1
        return starts[i], counts

    def varint(self, pos: int, end: int, path: str, at: int, limit: int = 10) -> tuple[int, int]:
        buf = self.buf
        result = shift = 0
        for _ in range(limit):
            if pos >= end:
                raise _Found(path, at, "truncated varint")
            b = buf[pos]
            pos += 1
            result |= (b & 0x7F) << shift
            if b < 0x80:
                return result, pos
            shift += 7
        raise _Found(path, at, f"varint longer than {limit} bytes")

    def length(self, pos: int, end: int, path: str, at: int) -> tuple[int, int]:
        n, s = self.varint(pos, end, path, at, 5)
        if s + n > end:
            raise _Found(path, at, "length past the end of the message")
        return s, s + n

    def tag(self, pos: int, end: int, path: str, in_group: bool = False) -> tuple[int, int, int]:
        """(field number, wire type, position after) of the tag at ``pos``; in a group, whose fields
        the schema does not know, every fault is the group's (``path``)."""
        tag, after = self.varint(pos, end, path, pos, 5)
        if tag > 0xFFFF_FFFF:
            raise _Found(path, pos, "tag over 32 bits")
        if tag >> 3 == 0:
            raise _Found(path if in_group else f"{path}.#0", pos, "field number 0")
        return tag >> 3, tag & 7, after

    def skip(self, pos: int, end: int, wire_type: int, number: int, where: str, at: int, depth: int) -> int:
        """Past an unknown field's value (a group's, nested groups included)."""
        if wire_type == 0:
            return self.varint(pos, end, where, at)[1]
        if wire_type in (1, 5):
            width = 8 if wire_type == 1 else 4
            if pos + width > end:
                raise _Found(where, at, f"truncated fixed{width * 8}")
            return pos + width
        if wire_type == _LEN:
            return self.length(pos, end, where, at)[1]
        if wire_type == 3:
            return self.group(pos, end, number, where, at, depth)
        if wire_type == 4:
            raise _Found(where, at, "end-group tag without a start-group tag")
        raise _Found(where, at, f"invalid wire type {wire_type}")

    def group(self, pos: int, end: int, number: int, where: str, at: int, depth: int) -> int:
        open_groups = [number]
        if depth + 1 > _UPB_DEPTH:
            raise _Found(where, at, f"groups nested deeper than {_UPB_DEPTH} levels")
        while open_groups:
            if pos >= end:
                raise _Found(where, at, "group not closed before the end of its message")
            tag_at = pos
            inner, wire_type, pos = self.tag(pos, end, where, True)
            if wire_type == 4:
                if inner != open_groups[-1]:
                    raise _Found(where, tag_at, f"end-group tag of field {inner} closes the group of field "
                                                f"{open_groups[-1]}")
                open_groups.pop()
            elif wire_type == 3:
                open_groups.append(inner)
                if depth + len(open_groups) > _UPB_DEPTH:
                    raise _Found(where, tag_at, f"groups nested deeper than {_UPB_DEPTH} levels")
            else:
                pos = self.skip(pos, end, wire_type, inner, where, tag_at, depth)
        return pos

    def message(self, start: int, end: int, node: _Node, path: str, depth: int,
                counts: dict[int, int] | None = None) -> None:
        counts = {} if counts is None else counts
        pos = start
        while pos < end:
            at = pos
            number, wire_type, pos = self.tag(pos, end, path)
            f = node.fields.get(number)
            if f is None or not (wire_type == f.wire_type or (wire_type == _LEN and f.width >= 0)):
                # unknown, or a known field under another wire type: upb keeps it as an unknown field
                where = f"{path}.{f.name}" if f is not None else f"{path}.#{number}"
                pos = self.skip(pos, end, wire_type, number, where, at, depth)
                continue
            where = f"{path}.{f.name}"
            if wire_type == _LEN and f.width >= 0:
                s, pos = self.length(pos, end, where, at)
                self.packed(s, pos, f, number, where, at, counts)
                continue
            item = _indexed(where, f, counts, number)
            if wire_type == _LEN:
                s, pos = self.length(pos, end, item, at)
                if f.node is not None:
                    if depth < _MAX_DEPTH:
                        self.message(s, pos, f.node, item, depth + 1)
                elif f.string:
                    _utf8(self.buf, s, pos, item)
            elif wire_type == 0:
                value, pos = self.varint(pos, end, item, at)
                if f.refuse_negative:
                    value &= 0xFFFF_FFFF
                    self.negatives[item] = (at, value - (1 << 32) if value >> 31 else value)
            else:
                pos = self.skip(pos, end, wire_type, number, item, at, depth)

    def packed(self, s: int, e: int, f: _Field, number: int, where: str, at: int, counts: dict[int, int]) -> None:
        i = counts.get(number, 0)
        if f.width:
            if (e - s) % f.width:
                raise _Found(where, at, f"packed field of {e - s} bytes, not a multiple of {f.width}")
            counts[number] = i + (e - s) // f.width
            return
        pos = s
        while pos < e:
            pos = self.varint(pos, e, f"{where}[{i}]", pos)[1]
            i += 1
        counts[number] = i



# ---- entry point ---------------------------------------------------------------------------------


def _sound_v2(field: bytes) -> bool:
    """One top-level Request field that protobuf parses and whose series the relay takes (no
    metadata type read negative)."""
    try:
        request = remote_v2_pb2.Request.FromString(field)
    except DecodeError:
        return False
    return not any(ts.HasField("metadata") and ts.metadata.type < 0 for ts in request.timeseries)


def locate_v2(buf: bytes) -> Location | None:
    """The first spot of an RW 2.0 Request that protobuf's parser refuses, else the first metadata
    type the relay refuses (read negative), else None."""
    walk = _V2(buf)
    root = _schema(2)
    try:
        start, counts = walk.first_suspect(root)
        walk.message(start, len(buf), root, root.name, 0, counts)
    except _Found as found:
        return found.location
    negative = [(at, path, value) for path, (at, value) in walk.negatives.items() if value < 0]
    if negative:
        at, path, value = min(negative)
        return Location(path, at, f"negative enum value {value}")
    return None


