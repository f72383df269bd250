"""Where a remote-write body is malformed: the first bad spot as a field path, its byte and why.

``locate_v1(buf)`` walks the raw bytes of a ``prometheus.WriteRequest`` and ``locate_v2(buf)``
(relay.ingest.wire_locate_v2) those of an ``io.prometheus.write.v2.Request``, driven by the
generated descriptors (relay.proto), and returns a ``Location``
(``Request.timeseries[3].samples[0].timestamp``, byte 1234, "truncated varint"), or None where it finds
nothing wrong. They run on the error path only, to word a 400
(relay.ingest.wire_errors.route_error, relay.ingest.wire_v2.py_v2_to_v1): plain Python, linear in the
body; the recursion is the schema's own depth (at most four messages), and groups, the only
nesting the sender chooses, are skipped with a counter. For RW 2.0 the top-level fields go to
protobuf's parser in runs first, and only from the first run it refuses is the body walked field
by field (a 5 MB body refused at its end: about 0.5 s).

Each dialect refuses what its parser refuses, and nothing more:

- RW 1.0: the relay's own parser (relay.ingest.wire, wire_codec, wire_entries), in its words: field
  numbers 0 or past 2^29-1, groups and wire types 6 and 7, varints over 10 bytes or 64 bits, a
  length or fixed value past the end of its message, a known field with another wire type (packed
  repeated numbers aside), invalid UTF-8 in label names and values and in metadata strings (for a
  series' label, the last name and value only, as ``decode_labels`` reads them); at the top, a
  TimeSeries tag in more than one byte. Label sets and histogram spans, which are not wire
  format, are the caller's checks.
- RW 2.0: protobuf's parser (upb): a known field with another wire type is an unknown field;
  groups are skipped, 100 levels deep at most (the messages above them count); tags and lengths at
  most 5 bytes, tags below 2^32; varints at most 10 bytes (bits past 64 dropped); every string
  valid UTF-8; then the relay's one refusal after parsing, a ``Metadata.type`` read negative (the
  value that counts: the last one), reported only where the wire format is sound.

Paths: the message's name, then field names, with the element's index for repeated fields (a
packed element's too: ``labels_refs[5]``) and ``#N`` for a field number the schema does not know.
Offsets count bytes of the uncompressed message: the field's tag, or for a packed element the
element and for a string its first invalid byte.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from google.protobuf.descriptor import Descriptor, FieldDescriptor

from relay.common.protowire import MAX_FIELD_NUMBER, WireError, read_len, skip_value, uvarint
from relay.proto import remote_v1_pb2, remote_v2_pb2

_LEN = 2
_MALFORMED = "malformed protobuf: "
_FIXED = {FieldDescriptor.TYPE_DOUBLE: 8, FieldDescriptor.TYPE_FIXED64: 8, FieldDescriptor.TYPE_SFIXED64: 8,
          FieldDescriptor.TYPE_FLOAT: 4, FieldDescriptor.TYPE_FIXED32: 4, FieldDescriptor.TYPE_SFIXED32: 4}
_UPB_DEPTH = 100  # upb's default nesting limit: submessages and groups together
_MAX_DEPTH = 16  # far above either schema's depth: a guard, never reached


@dataclass(frozen=True, slots=True)
class Location:
    """A malformed spot: ``path`` names the field, ``offset`` its byte, ``reason`` what is wrong."""

    path: str
    offset: int
    reason: str

    def __str__(self) -> str:
        return f"{self.path} (byte {self.offset}): {self.reason}"


@dataclass(frozen=True, slots=True)
class _Field:
    name: str
    wire_type: int  # as declared
    repeated: bool
    width: int  # packable repeated number: 0 varints, 4 or 8 fixed; -1 not packable
    string: bool
    refuse_negative: bool  # an int32 read negative is refused (RW 2.0 Metadata.type)
    node: _Node | None  # a message field's schema


@dataclass(frozen=True, slots=True)
class _Node:
    name: str
    fields: dict[int, _Field]
    last_strings: bool  # only each string field's last occurrence is checked (RW 1.0 series labels)


class _Found(Exception):
    def __init__(self, path: str, offset: int, reason: str) -> None:
        super().__init__(reason)
        self.location = Location(path, offset, reason)


def _wire_type(f: FieldDescriptor) -> int:
    if f.type in (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES, FieldDescriptor.TYPE_MESSAGE):
        return _LEN
    width = _FIXED.get(f.type)
    return 0 if width is None else 1 if width == 8 else 5


def _node(d: Descriptor, via: tuple[str, ...], last_strings: frozenset[tuple[str, ...]],
          refuse_negative: frozenset[tuple[str, ...]]) -> _Node:
    """The schema below ``d`` as a tree (a message reached by two paths gets two nodes)."""
    fields = {}
    for number, f in d.fields_by_number.items():
        at = (*via, f.name)
        child = _node(f.message_type, at, last_strings, refuse_negative) if f.message_type else None
        wire_type = _wire_type(f)
        numeric = f.is_repeated and wire_type != _LEN
        fields[number] = _Field(f.name, wire_type, f.is_repeated, _FIXED.get(f.type, 0) if numeric else -1,
                                f.type == FieldDescriptor.TYPE_STRING, at in refuse_negative, child)
    return _Node(d.name, fields, via in last_strings)


@cache
def _schema(version: int) -> _Node:
    if version == 1:
        return _node(remote_v1_pb2.WriteRequest.DESCRIPTOR, (), frozenset({("timeseries", "labels")}), frozenset())
    return _node(remote_v2_pb2.Request.DESCRIPTOR, (), frozenset(), frozenset({("timeseries", "metadata", "type")}))


def schema_fields(version: int, names: tuple[str, ...]) -> tuple[str, dict[int, str]] | None:
    """(message name, field number -> name) of the message reached from the root by field ``names``,
    None where no such message is (for tests that check a Location's path)."""
    node: _Node | None = _schema(version)
    for name in names:
        assert node is not None
        node = next((f.node for f in node.fields.values() if f.name == name), None)
        if node is None:
            return None
    assert node is not None
    return node.name, {n: f.name for n, f in node.fields.items()}


def _reason(error: WireError) -> str:
    return error.message.removeprefix(_MALFORMED)


def _utf8(buf: bytes, start: int, end: int, path: str) -> None:
    try:
        buf[start:end].decode("utf-8")
    except UnicodeDecodeError as e:
        raise _Found(path, start + e.start, "invalid UTF-8") from None


def _indexed(where: str, f: _Field, counts: dict[int, int], number: int) -> str:
    """The element's path (its index counted per field), or the field's for a singular one."""
    if not f.repeated:
        return where
    i = counts.get(number, 0)
    counts[number] = i + 1
    return f"{where}[{i}]"


# ---- RW 1.0: the relay's own parser ----------------------------------------------------------------


_Framed = tuple[int, int, int, int, int, str, int]  # tag offset, number, wire type, value start, end, path, index


class _V1:
    """In the route's order: at the top, entry by entry; below, as ``protowire.fields`` and the
    entry checks read a message (every field framed, then each checked in turn), a series' label
    contents after its other fields (``decode_labels`` runs last)."""

    def __init__(self, buf: bytes) -> None:
        self.buf = buf

    def message(self, start: int, end: int, node: _Node, path: str, root: bool, depth: int) -> None:
        counts: dict[int, int] = {}
        framed: list[_Framed] = []
        pos = start
        while pos < end:
            field = self.frame(pos, end, node, path, root, counts)
            pos = field[4]
            if root:
                self.check(field, node, depth, {})
            else:
                framed.append(field)
        last: dict[int, tuple[int, int, str]] = {}  # last_strings: number -> (start, end, path)
        later = [field for field in framed if self.check(field, node, depth, last)]
        for field in later:
            self.check(field, node, depth, last, True)
        for number in sorted(last):  # name, then value: decode_labels' order
            _utf8(self.buf, *last[number])

    def frame(self, pos: int, end: int, node: _Node, path: str, root: bool, counts: dict[int, int]) -> _Framed:
        """One field's tag and extent, as ``protowire.fields`` reads it; its index among the field's
        elements (packed ones counted by their last bytes)."""
        buf = self.buf
        at = pos
        try:
            tag, pos = uvarint(buf, pos)
        except WireError as e:
            raise _Found(path, at, _reason(e)) from None
        number, wire_type = tag >> 3, tag & 7
        f = node.fields.get(number)
        where = f"{path}.{f.name}" if f is not None else f"{path}.#{number}"
        index = counts.get(number, 0)
        element = f is not None and f.repeated and wire_type == f.wire_type
        if number == 0 or number > MAX_FIELD_NUMBER:
            raise _Found(where, at, f"field number {number}")
        if root and f is not None and (wire_type != _LEN or (number == 1 and pos - at > 1)):
            # the route reads a series only under the one-byte tag, and checks a top-level field's
            # type before its value
            raise _Found(where, at, f"{node.name} field {number} with wire type {wire_type}")
        try:
            if wire_type == _LEN:
                s, pos = read_len(buf, pos, end)
            else:
                s, pos = pos, skip_value(buf, pos, wire_type, end)
        except WireError as e:
            reason = _reason(e)
            if root and number == 1 and reason.startswith("length past"):
                reason = "TimeSeries past the end of the request"
            raise _Found(f"{where}[{index}]" if element else where, at, reason) from None
        if element:
            counts[number] = index + 1
        elif f is not None and f.width >= 0 and wire_type == _LEN:
            width = f.width
            counts[number] = index + ((pos - s) // width if width else sum(b < 0x80 for b in buf[s:pos]))
        return at, number, wire_type, s, pos, where, index

    def check(self, field: _Framed, node: _Node, depth: int, last: dict[int, tuple[int, int, str]],
              content: bool = False) -> bool:
        """The field's wire type, then its content; True: a series label, whose content comes last
        (checked when ``content``)."""
        at, number, wire_type, s, e, where, index = field
        f = node.fields.get(number)
        if f is None:
            return False
        if wire_type != f.wire_type and not (wire_type == _LEN and f.width >= 0):
            raise _Found(where, at, f"{node.name} field {number} with wire type {wire_type}")
        item = f"{where}[{index}]" if f.repeated else where
        if f.node is not None:
            if f.node.last_strings and not content:
                return True
            if depth < _MAX_DEPTH:
                self.message(s, e, f.node, item, False, depth + 1)
        elif f.string:
            if node.last_strings:
                last[number] = (s, e, item)
            else:
                _utf8(self.buf, s, e, item)
        elif wire_type == _LEN and f.wire_type != _LEN:
            self.packed(s, e, f, node.name, number, where, at, index)
        return False

    def packed(self, s: int, e: int, f: _Field, message: str, number: int, where: str, at: int, i: int) -> None:
        buf = self.buf
        if f.width:
            if (e - s) % f.width:
                raise _Found(where, at, f"{message} field {number}: packed doubles of {e - s} bytes")
            return
        if s < e and buf[e - 1] >= 0x80:
            raise _Found(where, at, f"truncated varint at the end of a {message} packed field")
        pos = s
        while pos < e:
            try:
                pos = uvarint(buf, pos)[1]
            except WireError as err:
                raise _Found(f"{where}[{i}]", pos, _reason(err)) from None
            i += 1


# ---- entry points ----------------------------------------------------------------------------------


def locate_v1(buf: bytes, start: int = 0, end: int | None = None, *, within: tuple[str, ...] = (),
              path: str | None = None) -> Location | None:
    """The first spot of ``buf[start:end]`` the relay's RW 1.0 parser refuses, or None.

    ``within``: field names from WriteRequest down to the message ``buf[start:end]`` holds (e.g.
    ``("timeseries", "samples")`` for one Sample's payload), ``path`` its rendered path."""
    stop = len(buf) if end is None else end
    node = _schema(1)
    for name in within:
        node = next(f.node for f in node.fields.values() if f.name == name and f.node is not None)
    try:
        _V1(buf).message(start, stop, node, path or node.name, not within, 0)
    except _Found as found:
        return found.location
    return None


# ---- the bound on the error path -------------------------------------------------------------------

LOCATE_MAX_BYTES = 4 << 20  # a refused body larger than this is not walked to word its 400


def not_located(message: str, size: int) -> str:
    """A refusal's text when its body is too large to be walked (``LOCATE_MAX_BYTES``): the walk costs
    a few times the parse, and a sender of large malformed bodies must not cost more than valid ones."""
    return f"{message} (not located: the body has {size} bytes, over {LOCATE_MAX_BYTES >> 20} MiB)"
