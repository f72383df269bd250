"""A request's metadata (WriteRequest field 3): each well-formed MetricMetadata entry's family name,
its raw bytes as they came (forwarded unchanged to the destinations that keep the family) and
whether it declares a counter (the pipeline learns counter families from it). Malformed entries are
left out, never forwarded; no error escapes.
"""

from __future__ import annotations

from relay.common.protowire import fields, uvarint
from relay.ingest import wire

FAMILY_SUFFIXES = ("", "_total", "_bucket", "_sum", "_count")  # metadata family -> its series' names
_COUNTER = 1  # MetricMetadata.MetricType COUNTER


def metadata_entries(metadata: bytes) -> list[tuple[str, bytes, bool]]:
    """(family name, raw tag-wrapped entry, is a counter) of each well-formed WriteRequest field-3
    entry; a malformed one is left out (never forwarded), the others still count."""
    out: list[tuple[str, bytes, bool]] = []
    try:
        entries = [(start, end, tag_start) for number, wire_type, tag_start, start, end
                   in fields(metadata, 0, len(metadata)) if number == 3 and wire_type == 2]
    except wire.WireError:  # route() kept these raw entries: they are framed, but be safe
        return out
    for start, end, tag_start in entries:
        family, kind = "", 0
        try:
            for n2, wt2, _, s2, e2 in fields(metadata, start, end):
                if n2 == 2 and wt2 == 2:
                    family = metadata[s2:e2].decode()
                elif n2 == 1 and wt2 == 0:
                    kind = uvarint(metadata, s2)[0]
        except (wire.WireError, UnicodeDecodeError):
            continue
        out.append((family, metadata[tag_start:end], kind == _COUNTER))
    return out
