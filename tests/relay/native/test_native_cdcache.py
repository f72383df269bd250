"""relay.native._cdcache.DecisionTable against a dict: the same answers for every decision shape the
pipeline stores (and for shapes it does not: they are kept whole), no leaked references, bounded
memory, and its SipHash against the reference vectors. Runs whenever the module is built; skips
only when the native core is off (GPU_RELAY_NATIVE=0) or not built."""

from __future__ import annotations

import gc
import sys
import tracemalloc
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from relay import native
from relay.ingest import wire
from relay.state.stage import CLAIM, POS_SHIFT

_c = native.load("cdcache")
if _c is None:  # pragma: no cover - the Python-only run
    pytest.skip("relay.native._cdcache is off (GPU_RELAY_NATIVE=0) or not built", allow_module_level=True)
cd: Any = _c

WIDTH = 5  # the input and 4 destinations
EXT = b"\n\x0c\n\x07cluster\x12\x01c"  # a stage's shared external-labels bytes
OTHER_EXT = b"\n\x08\n\x04zone\x12\x00"
METRICS = [sys.intern(m) for m in ("m", "DCGM_FI_DEV_GPU_UTIL", "up", "")]
DROPS = [(b"", 0, "rules"), (b"", 0, "too_many_labels"), (b"", 0, "collision")]
LABEL = st.tuples(st.sampled_from(["__name__", "gpu", "pod", "UUID", "job", "a" * 130, "zone", "cluster"]),
                  st.text(min_size=0, max_size=140))
LABEL_KEYS = st.lists(LABEL, max_size=8, unique_by=lambda x: x[0]).map(
    lambda ls: wire.encode_labels(sorted(ls)))  # keys as the route loop sees them (lengths over 127 too)
KEYS = st.binary(min_size=0, max_size=300) | LABEL_KEYS
U64 = st.integers(0, (1 << 64) - 1)


def entries(key: bytes) -> list[bytes]:
    """The key's Label entries, each as its bytes."""
    out, p = [], 0
    while p < len(key):
        n, q = wire.uvarint(key, p + 1)
        out.append(key[p:q + n])
        p = q + n
    return out


def same_without_key(got: Any, want: Any, key: bytes) -> bool:
    """A decision read back without its key (popitem, values) against the stored one: None where
    the key, or bytes made from it, were."""
    if not (isinstance(got, tuple) and got and isinstance(got[0], tuple)) or got is want:
        return bool(got == want)
    if not isinstance(want, tuple) or len(got) != len(want):  # (values() scans every stored one: None too)
        return False
    for g, w in zip(got, want, strict=True):
        if isinstance(g, tuple) and g and g[0] is None:
            if not (isinstance(w, tuple) and len(w) == len(g) and g[1:] == w[1:] and isinstance(w[0], bytes)):
                return False
        elif g != w:
            return False
    return True


@st.composite
def dest_decisions(draw: st.DrawFn, key: bytes) -> Any:
    kind = draw(st.sampled_from(["none", "drop", "aggregated", "key", "key_claim", "ext", "own", "own_claim",
                                 "own_equal", "pruned", "pruned", "unusual"]))
    metric = draw(st.sampled_from(METRICS))
    sid = draw(U64)
    pos = draw(st.integers(0, 1 << 20))
    if kind == "none":
        return None
    if kind == "drop":
        return draw(st.sampled_from(DROPS))
    if kind == "aggregated":
        return (draw(st.binary(max_size=40)), -draw(st.integers(1, 5)), metric)
    if kind == "key":
        return (key, sid, metric)
    if kind == "key_claim":
        return (key, sid | CLAIM | draw(st.sampled_from([0, pos << POS_SHIFT])), metric)
    if kind == "ext":
        return (draw(st.sampled_from([EXT, OTHER_EXT])), sid | draw(st.sampled_from([0, CLAIM]))
                | (pos + 1) << POS_SHIFT, metric)
    if kind in ("own", "own_claim"):
        return (draw(st.binary(min_size=1, max_size=200)), sid | (CLAIM if kind == "own_claim" else 0), metric)
    if kind == "own_equal":  # the rules produced the key's own bytes, as another object
        return (bytes(bytearray(key)), sid, metric)
    if kind == "pruned":  # the key with some entries left out and a run put in (prune + external labels)
        try:
            es = entries(key)
        except (IndexError, wire.WireError):
            es = []
        kept = [e for e in es if draw(st.booleans())]
        at = draw(st.integers(0, len(kept)))
        run = draw(st.sampled_from([b"", EXT, OTHER_EXT, draw(st.binary(max_size=30))]))
        return (b"".join(kept[:at]) + run + b"".join(kept[at:]), sid | draw(st.sampled_from([0, CLAIM])), metric)
    return draw(st.sampled_from([
        (key, sid | 1 << 300, metric),  # an id too wide
        (b"x", sid | 5 << POS_SHIFT, metric),  # a position without the shared bytes ... still packed
        (key, "not an int", metric),
        ("not bytes", sid, metric),
        (key, sid),
        (b"", 1, "odd drop"),
        (b"", 0, None),
        [key, sid, metric],
        ("x",),
        (),
    ]))


@st.composite
def decisions(draw: st.DrawFn, key: bytes) -> Any:
    shape = draw(st.sampled_from(["usual"] * 8 + ["whole"]))
    metric = draw(st.sampled_from(METRICS))
    in_id = draw(st.integers(0, (1 << 60) - 1))
    same_key = draw(st.booleans())
    k = key if same_key else bytes(bytearray(key))
    if shape == "whole":
        return draw(st.sampled_from([
            ((k, 1 << 64, metric),) + (None,) * (WIDTH - 1),  # an input id over 64 bits
            ((k, -1, metric),) + (None,) * (WIDTH - 1),
            ((k + b"?", 1, metric),) + (None,) * (WIDTH - 1),  # not this key's input
            ((k, 1, metric), None),  # another width
            ((k, 1),) + (None,) * (WIDTH - 1),
            None,
            "a string",
            12,
        ]))
    return ((k, in_id, metric), *[draw(dest_decisions(key)) for _ in range(WIDTH - 1)])


class TableVsDict(RuleBasedStateMachine):
    """Random set/get/pop/popitem/contains/len/clear on a DecisionTable and on a dict."""

    width = WIDTH

    def decision(self, key: bytes, data: st.DataObject) -> Any:
        return data.draw(decisions(key))

    def many(self, key: bytes, i: int) -> Any:
        """set_many's i-th decision"""
        return ((key, i, "m"), (EXT, i | (i + 1) << POS_SHIFT, "m"), DROPS[i % 3], (key, i, "m"),
                (b"own%d" % i, i | CLAIM, "m"))

    @initialize()
    def start(self) -> None:
        self.table: Any = cd.DecisionTable(self.width)
        self.model: dict[bytes, Any] = {}
        self.keys: list[bytes] = [b""]

    @rule(key=KEYS, data=st.data())
    def set_new(self, key: bytes, data: st.DataObject) -> None:
        value = self.decision(key, data)
        self.table[key] = value
        self.model[key] = value
        self.keys.append(key)

    @rule(data=st.data())
    def set_existing(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(self.keys))
        value = self.decision(key, data)
        self.table[bytes(bytearray(key))] = value  # an equal key, another object
        self.model[key] = value

    @rule(n=st.integers(1, 600), data=st.data())
    def set_many(self, n: int, data: st.DataObject) -> None:
        """Enough entries to force the index to grow (and later, popped, to shrink)."""
        base = data.draw(st.binary(max_size=20))
        for i in range(n):
            key = base + i.to_bytes(3, "little")
            value = self.many(key, i)
            self.table[key] = value
            self.model[key] = value
        self.keys.append(base + b"\0\0\0")

    @rule(data=st.data())
    def get(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(self.keys) | KEYS)
        probe = bytes(bytearray(key))
        got = self.table.get(probe)
        assert got == self.model.get(key)
        assert self.table.get(probe, "dflt") == self.model.get(key, "dflt")
        assert (probe in self.table) == (key in self.model)
        if key in self.model:
            assert self.table[probe] == self.model[key]
            if isinstance(got, tuple) and got and isinstance(got[0], tuple) and got[0][0] == key:
                assert got[0][0] is probe or got[0][0] is self.model[key][0][0]
        else:
            with pytest.raises(KeyError):
                self.table[probe]

    @rule(data=st.data())
    def pop(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(self.keys) | KEYS)
        assert self.table.pop(key, "absent") == self.model.pop(key, "absent")
        with pytest.raises(KeyError):
            self.table.pop(key)

    @rule(data=st.data())
    def delete(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(self.keys))
        if key in self.model:
            del self.table[key]
            del self.model[key]
        else:
            with pytest.raises(KeyError):
                del self.table[key]

    @rule(n=st.integers(1, 700))
    def popitem(self, n: int) -> None:
        by_digest = {cd.digest(k): k for k in self.model}
        for _ in range(n):
            if not self.model:
                with pytest.raises(KeyError):
                    self.table.popitem()
                return
            digest, value = self.table.popitem()
            key = by_digest.pop(digest)  # the digest names a key that was stored
            assert same_without_key(value, self.model.pop(key), key)

    @rule()
    def values(self) -> None:
        got = self.table.values()
        assert len(got) == len(self.model)
        if len(self.model) < 30:
            left = list(self.model.items())
            for v in got:  # each matches one stored decision
                i = next(i for i, (k, w) in enumerate(left) if same_without_key(v, w, k))
                del left[i]

    @precondition(lambda self: len(self.model) < 50)
    @rule()
    def clear(self) -> None:
        self.table.clear()
        self.model.clear()
        assert self.table.nbytes() == 0

    @invariant()
    def same_length(self) -> None:
        assert len(self.table) == len(self.model)
        assert (self.table.nbytes() == 0) == (not self.model)


TableVsDict.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None, suppress_health_check=list(HealthCheck))
test_decision_table_answers_like_a_dict = TableVsDict.TestCase


# ---- the hash ----------------------------------------------------------------------------------------

REF_KEY = bytes(range(16))


@pytest.mark.parametrize(("data", "size", "want"), [
    # SipHash-2-4 reference vectors (Aumasson & Bernstein: key 00..0f, message 00..len-1)
    (b"", 16, "a3817f04ba25a8e66df67214c7550293"),
    (bytes(range(1)), 16, "da87c1d86b99af44347659119b22fc45"),
    (bytes(range(2)), 16, "8177228da4a45dc7fca38bdef60affe4"),
    (bytes(range(3)), 16, "9c70b60c5267a94e5f33b6b02985ed51"),
    (b"", 8, "310e0edd47db6f72"),
    (bytes(range(15)), 8, "e545be4961ca29a1"),  # the paper's example: a129ca6149be45e5 little-endian
])
def test_siphash_matches_the_reference_vectors(data: bytes, size: int, want: str) -> None:
    assert cd.siphash(REF_KEY, data, 2, 4, size).hex() == want


def test_the_table_hash_is_keyed_per_process() -> None:
    import subprocess
    code = "from relay.native import _cdcache; print(_cdcache.digest(b'abc').hex())"
    runs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
            for _ in range(2)}
    assert len(runs) == 2  # a fresh random key in each process
    assert cd.digest(b"abc") == cd.digest(bytes(bytearray(b"abc"))) != cd.digest(b"abd")
    assert len(cd.digest(b"")) == 16


PAIR_LENGTHS = [0, 1, 7, 8, 9, 15, 16, 17, 63, 64, 65, 300]


@pytest.mark.parametrize("la", PAIR_LENGTHS)
def test_the_two_key_hash_is_the_one_key_hash_of_each_whatever_their_lengths(la: int) -> None:
    # the route hashes a request's keys two at a time: a common run of blocks, then each alone
    a = bytes((7 * i + la) % 256 for i in range(la))
    for lb in PAIR_LENGTHS:
        b = bytes((11 * i + 3 * lb) % 256 for i in range(lb))
        assert cd.digest_pair(a, b) == (cd.digest(a), cd.digest(b)), (la, lb)
        assert cd.digest_pair(b, a) == (cd.digest(b), cd.digest(a)), (lb, la)
    assert cd.digest_pair(a, a) == (cd.digest(a),) * 2


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=700), st.binary(max_size=700))
def test_the_two_key_hash_matches_the_one_key_hash_on_any_bytes(a: bytes, b: bytes) -> None:
    assert cd.digest_pair(a, b) == (cd.digest(a), cd.digest(b))


def test_the_two_key_hash_refuses_what_digest_refuses() -> None:
    with pytest.raises(TypeError):
        cd.digest_pair(b"a", "b")
    with pytest.raises(TypeError):
        cd.digest_pair(b"a")


# ---- shapes, errors and memory --------------------------------------------------------------------------


def test_get_rebuilds_the_callers_key_object_where_the_key_was() -> None:
    t = cd.DecisionTable(3)
    key = b"\n\x05\n\x01a\x12\x00"
    t[key] = ((key, 7, "m"), (key, 9 | CLAIM, "m"), (EXT, 5 | 3 << POS_SHIFT, "m"))
    probe = bytes(bytearray(key))
    got = t.get(probe)
    assert got == ((key, 7, "m"), (key, 9 | CLAIM, "m"), (EXT, 5 | 3 << POS_SHIFT, "m"))
    assert got[0][0] is probe and got[1][0] is probe  # no copy of the key is kept
    assert got[2][0] is EXT and got[0][2] is METRICS[0]


def test_drops_and_unusual_decisions_come_back_as_the_same_objects() -> None:
    t = cd.DecisionTable(3)
    agg = (b"group", -1, "m")
    t[b"k"] = ((b"k", 1, "m"), DROPS[0], agg)
    got = t[b"k"]
    assert got[1] is DROPS[0] and got[2] is agg
    t[b"w"] = whole = ("not", "a", "decision")
    assert t[b"w"] is whole


def test_width_is_fixed_by_the_first_value_and_checked() -> None:
    t = cd.DecisionTable()
    assert t.width == 0
    t[b"k"] = ((b"k", 1, "m"), None)
    assert t.width == 2
    t[b"x"] = ((b"x", 1, "m"), None, None)  # another width: kept whole, still answered
    assert t[b"x"] == ((b"x", 1, "m"), None, None)
    with pytest.raises(ValueError, match="width"):
        cd.DecisionTable(-1)
    with pytest.raises(ValueError, match="width"):
        cd.DecisionTable(1 << 20)


@pytest.mark.parametrize("key", ["str", 1, None, bytearray(b"k"), memoryview(b"k")])
def test_keys_other_than_bytes_are_a_type_error(key: Any) -> None:
    t = cd.DecisionTable(2)
    for op in (lambda: t.get(key), lambda: t[key], lambda: t.pop(key, None), lambda: key in t,
               lambda: t.__setitem__(key, None), lambda: cd.digest(key)):
        with pytest.raises(TypeError, match="bytes"):
            op()
    with pytest.raises(TypeError):
        t.get()
    with pytest.raises(TypeError):
        t.pop(b"a", 1, 2)


def test_popitem_on_an_empty_table_is_a_key_error() -> None:
    with pytest.raises(KeyError, match="empty"):
        cd.DecisionTable(2).popitem()


def test_values_are_every_decision_with_none_where_the_key_was() -> None:
    t = cd.DecisionTable(2)
    t[b"a"] = ((b"a", 1, "m"), (b"a", 2, "m"))
    t[b"b"] = ((b"b", 3, "m"), (EXT, 4 | 1 << POS_SHIFT, "m"))
    assert sorted(t.values(), key=repr) == sorted(
        [((None, 1, "m"), (None, 2, "m")), ((None, 3, "m"), (EXT, 4 | 1 << POS_SHIFT, "m"))], key=repr)


def _decision(i: int, own: bool, out_metric: str = "m") -> tuple[Any, ...]:
    key = b"series-%d" % i
    lb = (b"own-labels-%d" % i) * 3 if own else key
    return ((key, i, "m"), (lb, i | CLAIM, "m"), DROPS[0], (EXT, i | 2 << POS_SHIFT, out_metric))


@pytest.mark.parametrize(("out_metric", "dest_bytes"), [
    ("m", 16),  # every destination sent under the input's metric: narrow, (id, aux) a destination
    ("renamed", 24),  # one under another metric: wide, (id, ref, aux)
])
def test_nbytes_counts_packed_entries_and_the_bytes_only_they_hold(out_metric: str, dest_bytes: int) -> None:
    plain, own = cd.DecisionTable(4), cd.DecisionTable(4)
    assert plain.nbytes() == 0
    for i in range(1000):
        d = _decision(i, False, out_metric)
        plain[d[0][0]] = d
        d = _decision(i, True, out_metric)
        own[d[0][0]] = d
    per_entry = plain.nbytes() / 1000
    assert plain.words * 8 == 16 + 16 + 3 * dest_bytes
    assert 16 + 16 + 3 * dest_bytes <= per_entry <= 16 + 16 + 3 * dest_bytes + 11  # hash, input, dests, index
    extra = (own.nbytes() - plain.nbytes()) / 1000  # each owned label bytes object: header + ~40
    assert 60 <= extra <= 100
    for i in range(1000):
        own.pop(b"series-%d" % i)
    assert own.nbytes() == 0


def test_the_index_shrinks_after_many_deletions() -> None:
    t = cd.DecisionTable(2)
    for i in range(20_000):
        t[b"%d" % i] = ((b"%d" % i, i, "m"), None)
    full = t.nbytes()
    for i in range(19_900):
        del t[b"%d" % i]
    assert t.nbytes() < full / 50
    assert all(t[b"%d" % i] == ((b"%d" % i, i, "m"), None) for i in range(19_900, 20_000))


def test_references_to_shared_objects_come_back_after_clear_pop_and_del() -> None:
    metric = sys.intern("a_metric_only_this_test_uses")
    drop = (b"", 0, "only_this_test")
    ext = b"\n\x03\n\x01z" + bytes(5)
    own = b"own labels only this test holds"
    objs = [metric, drop, ext, own]
    before = [sys.getrefcount(o) for o in objs]
    t = cd.DecisionTable(4)
    for i in range(500):
        key = b"k%d" % i
        t[key] = ((key, i, metric), drop, (ext, i | 9 << POS_SHIFT, metric), (own, i, metric))
    assert sys.getrefcount(metric) >= before[0] + 1000
    for i in range(100):
        t.get(b"k%d" % i)
        t.pop(b"k%d" % i)
    for _ in range(100):
        t.popitem()
    for i in range(200, 300):  # replaced by a value holding none of them
        t[b"k%d" % i] = None
    t.clear()
    assert [sys.getrefcount(o) for o in objs] == before
    t2 = cd.DecisionTable(4)
    t2[b"k"] = ((b"k", 1, metric), drop, (ext, 1 | 9 << POS_SHIFT, metric), (own, 1, metric))
    del t2
    gc.collect()
    assert [sys.getrefcount(o) for o in objs] == before


def test_memory_stays_bounded_over_many_set_and_pop_cycles() -> None:
    t = cd.DecisionTable(3)

    def cycle(n: int) -> None:
        for i in range(n):
            key = b"series-%d" % (i % 5000)
            t[key] = ((key, i, "m"), (b"own-%d" % i, i | CLAIM, "m"), (EXT, i | 4 << POS_SHIFT, "m"))
            if i % 3 == 0:
                t.pop(key)
            elif i % 7 == 0:
                t.popitem()
            t.get(key)

    cycle(20_000)  # warm: the table at its working size
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        cycle(100_000)
        grown = tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()
    assert grown < 1_000_000  # 100k cycles of ~100-byte objects would be ~10 MB if anything leaked
    t.clear()
    assert t.nbytes() == 0 and len(t) == 0


def test_outputs_made_from_the_key_by_the_rules_keep_no_copy() -> None:
    """prune_labels / labeldrop with external labels: the key minus some entries plus a shared run."""
    labels = [("UUID", "GPU-1"), ("__name__", "DCGM_FI_DEV_GPU_UTIL"), ("gpu", "0"), ("pci_bus_id", "0:18"),
              ("pod", "trainer-0"), ("zone", "z")]
    plain, pruned = cd.DecisionTable(2), cd.DecisionTable(2)
    for i in range(500):
        ls = [*labels, ("instance", f"10.0.0.{i}:9400")]
        key = wire.encode_labels(sorted(ls))
        out = wire.encode_labels(sorted([x for x in ls if x[0] not in ("pod", "pci_bus_id")] + [("cluster", "prod")]))
        plain[key] = ((key, i, "m"), (key, i, "m"))
        pruned[key] = ((key, i, "m"), (out, i | CLAIM, "m"))
        got = pruned[bytes(bytearray(key))]
        assert got == ((key, i, "m"), (out, i | CLAIM, "m"))
    assert (plain.words, pruned.words) == (5, 6)  # plain compact, pruned narrow (an edit's aux is 64 bits)
    assert pruned.nbytes() - plain.nbytes() - 500 * 8 < 200  # that word, and the run "cluster=prod" once
    assert pruned.values()[0][1][0] is None  # made from the key: without one, None


def test_runs_that_are_not_shared_do_not_take_the_shared_objects_places() -> None:
    t = cd.DecisionTable(3)
    for i in range(100):  # a per-series value put in: its own bytes after the first few
        key = wire.encode_labels([("a", "1"), ("z", str(i))])
        t[key] = ((key, i, "m"), (wire.encode_labels([("a", "1"), ("b", f"v{i}"), ("z", str(i))]), i, "m"), None)
    before = t.nbytes()
    for i in range(20):  # ext-spliced outputs (each a shared object, by identity) still pack
        key = b"k%d" % i
        t[key] = ((key, i, "m"), None, (EXT, i | 3 << POS_SHIFT, "m"))
    assert t.nbytes() - before <= 20 * 80 + 512  # 80-byte entries (a tuple kept whole: +112 each)
    assert all(t[b"k%d" % i][2][0] is EXT for i in range(20))


def test_rebuilt_decisions_of_atomic_objects_are_not_tracked_by_the_gc() -> None:
    t = cd.DecisionTable(3)
    t[b"k"] = ((b"k", 1, "m"), (b"k", 2, "m"), DROPS[0])
    got = t[b"k"]
    assert not gc.is_tracked(got) and not gc.is_tracked(got[0]) and not gc.is_tracked(got[1])
    t[b"x"] = ((b"x", 1, "m"), (b"x", 2, "m"), odd := (b"g", -1, ["a list"]))
    got = t[b"x"]
    assert gc.is_tracked(got) and got[2] is odd  # holds what the table did not pack: left to the GC


def test_a_table_past_a_mebibyte_grows_shrinks_and_clears_through_its_own_mappings() -> None:
    """Index and entries of 1 MiB and more are mmap'd (entries grown by mremap): growth across the
    boundary, every entry still found, removals shrinking back under it, clear while mapped."""
    t = cd.DecisionTable(2)
    n = 200_000
    keys = [b"series-%d" % i for i in range(n)]
    for i, k in enumerate(keys):
        t[k] = ((k, i, "m"), (EXT, i | 1 << POS_SHIFT, "m"))
    assert len(t) == n and t.nbytes() > 2 << 20
    assert all(t[k] == ((k, i, "m"), (EXT, i | 1 << POS_SHIFT, "m")) for i, k in enumerate(keys))
    for k in keys[100:]:
        assert t.pop(k)[0][0] == k
    assert len(t) == 100 and t.nbytes() < 1 << 20
    assert all(t[k][0][1] == i for i, k in enumerate(keys[:100])) and keys[100] not in t
    for i, k in enumerate(keys):
        t[k] = ((k, i, "m"), None)
    assert len(t) == n and t[keys[-1]] == ((keys[-1], n - 1, "m"), None)
    t.clear()
    assert len(t) == 0 and t.nbytes() == 0 and t.get(keys[0]) is None


# ---- narrow and wide entries -------------------------------------------------------------------------

def _label_key(i: int) -> bytes:
    return wire.encode_labels((("__name__", "m"), ("gpu", str(i % 8)), ("instance", f"10.0.{i // 250}.{i % 250}"),
                               ("pod", f"p{i}")))


def _every_kind(i: int, key: bytes, metric: str) -> tuple[Any, ...]:
    """A decision with a destination of every kind a narrow table packs, all sent under ``metric``."""
    pruned = wire.encode_labels((("__name__", "m"), ("gpu", str(i % 8)), ("instance", f"10.0.{i // 250}.{i % 250}")))
    return ((key, i, metric), None, DROPS[i % 3], (b"aggregated", -1 - i % 3, metric),
            (EXT, i | (i % 7 + 1) << POS_SHIFT, metric), (b"own-%d" % i, i | CLAIM, metric), (key, i, metric),
            (pruned + EXT, i | CLAIM, metric))


def test_a_narrow_table_turns_wide_for_a_decision_under_another_metric_and_keeps_every_entry() -> None:
    """Every destination kind in the narrow layout, a table past a mebibyte (entries mremap'd as
    they widen), one decision renaming the metric: every entry reads back as stored, and the
    references held come back after clear."""
    metric, renamed = sys.intern("a_metric_only_the_widening_test_uses"), sys.intern("renamed_by_the_rules")
    n = 12_000
    keys = [_label_key(i) for i in range(n)]
    before = [sys.getrefcount(metric), sys.getrefcount(renamed)]
    stored = {k: _every_kind(i, k, metric) for i, k in enumerate(keys)}
    t = cd.DecisionTable(8)
    for k in keys:
        t[k] = stored[k]
    assert t.words == 4 + 2 * 7 and t.nbytes() > 1 << 20
    narrow = t.nbytes()
    assert all(t[k] == v for k, v in stored.items())
    key = keys[17]
    stored[key] = ((key, 17, metric), None, None, None, None, None, (key, 17, renamed), None)
    t[key] = stored[key]
    assert t.words == 4 + 3 * 7
    assert abs(t.nbytes() - narrow - n * 7 * 8) < 1000  # 8 bytes more a destination (entry 17 holds less)
    assert len(t) == n and all(t[k] == v for k, v in stored.items())
    fresh = _label_key(n)
    stored[fresh] = _every_kind(n, fresh, metric)
    t[fresh] = stored[fresh]  # the wide layout from now on, whatever the decision
    assert t.words == 4 + 3 * 7 and t[fresh] == stored[fresh]
    digest, value = t.popitem()
    assert digest == cd.digest(fresh) and same_without_key(value, stored.pop(fresh), fresh)
    assert t.pop(keys[0]) == stored.pop(keys[0])
    assert all(t[k] == v for k, v in stored.items())
    t.clear()
    del stored, value
    gc.collect()
    assert [sys.getrefcount(metric), sys.getrefcount(renamed)] == before


def test_a_new_table_starts_in_its_smallest_layout_whatever_its_generation_before_was() -> None:
    wide = cd.DecisionTable(2)
    wide[b"a"] = ((b"a", 1, "m"), (b"a", 2, "other"))
    assert wide.words == 4 + 3
    young = cd.DecisionTable(wide.width)  # what DecisionCache makes at a swap
    young[b"a"] = ((b"a", 1, "m"), (b"a", 2, "m"))
    assert young.words == 4 + 1 and cd.DecisionTable().words == 0 and cd.DecisionTable(3).words == 4 + 2 * 2


def _pruned(key: bytes) -> bytes:
    return b"".join(entries(key)[1:]) + EXT


@pytest.mark.parametrize(("name", "dest", "words"), [
    # one destination: compact (1 word: its id; the aux in the hash's top 16 bits) while the output
    # label bytes are the key's or a shared object's put in at position 1021 at the most
    ("the key", lambda k: (k, 7, "m"), 5),
    ("the key, claimed", lambda k: (k, 7 | CLAIM, "m"), 5),
    ("external labels at 0", lambda k: (EXT, 7 | 1 << POS_SHIFT, "m"), 5),
    ("external labels at 1021", lambda k: (EXT, 7 | CLAIM | 1022 << POS_SHIFT, "m"), 5),
    ("a drop", lambda k: DROPS[1], 5),
    ("None", lambda k: None, 5),
    ("aggregated", lambda k: (b"agg", -3, "m"), 5),
    ("external labels at 1022", lambda k: (EXT, 7 | 1023 << POS_SHIFT, "m"), 6),  # narrow: (id, aux)
    ("its own bytes", lambda k: (b"own bytes", 7, "m"), 6),
    ("an edit of the key", lambda k: (_pruned(k), 7 | CLAIM, "m"), 6),
    ("another metric", lambda k: (k, 7, "renamed"), 7),  # wide: (id, ref, aux)
])
def test_a_table_of_one_destination_takes_the_layout_its_decisions_need(name: str, dest: Any, words: int) -> None:
    t = cd.DecisionTable(2)
    keys = [wire.encode_labels((("__name__", "m"), ("gpu", str(i)), ("zone", "z"))) for i in range(300)]
    for i, k in enumerate(keys):  # compact decisions first
        t[k] = ((k, i, "m"), (EXT, i | CLAIM | (i + 1) << POS_SHIFT, "m") if i % 2 else (k, i, "m"))
    assert t.words == 5
    odd = keys[0] + b"\n\x03\n\x01q"
    t[odd] = ((odd, 1, "m"), dest(odd))
    assert t.words == words and t[odd] == ((odd, 1, "m"), dest(odd)), name
    assert all(t[k] == ((k, i, "m"), (EXT, i | CLAIM | (i + 1) << POS_SHIFT, "m") if i % 2 else (k, i, "m"))
               for i, k in enumerate(keys))
    digest, got = t.popitem()
    assert digest == cd.digest(odd) and same_without_key(got, ((odd, 1, "m"), dest(odd)), odd)


def _under_the_input_metric(value: Any) -> Any:
    """value with every destination that may be sent (bytes, a non-negative int id) under the input's
    metric: what a narrow table keeps narrow"""
    if not (isinstance(value, tuple) and len(value) == WIDTH and isinstance(value[0], tuple) and len(value[0]) == 3):
        return value
    m = value[0][2]
    return (value[0], *[(d[0], d[1], m) if isinstance(d, tuple) and len(d) == 3 and isinstance(d[1], int)
                        and d[1] >= 0 and d[0] else d for d in value[1:]])


class NarrowTableVsDict(TableVsDict):
    """The same machine on a table that stays narrow until the rule ``rename`` stores a decision under
    another metric (values stored whole and unusual destinations keep their own metric)."""

    def decision(self, key: bytes, data: st.DataObject) -> Any:
        return _under_the_input_metric(super().decision(key, data))

    @precondition(lambda self: len(self.model) > 20)
    @rule(key=KEYS)
    def rename(self, key: bytes) -> None:
        value = ((key, 1, "m"), (key, 2, "renamed"), *[DROPS[0]] * (self.width - 2))
        self.table[key] = value
        self.model[key] = value
        self.keys.append(key)
        assert self.table.words == 4 + 3 * (self.width - 1)


NarrowTableVsDict.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None, suppress_health_check=list(HealthCheck))
test_a_narrow_decision_table_answers_like_a_dict = NarrowTableVsDict.TestCase


@st.composite
def one_destination(draw: st.DrawFn, key: bytes) -> Any:
    """A decision of width 2 (or a shape stored whole), its destination mostly under the input's metric"""
    value = draw(decisions(key))
    if draw(st.integers(0, 9)):
        value = _under_the_input_metric(value)
    return value[:2] if isinstance(value, tuple) and len(value) == WIDTH and isinstance(value[0], tuple) else value


class CompactTableVsDict(NarrowTableVsDict):
    """The machine on a table of one destination: compact until a decision needs more (its own
    label bytes, an edit, a far position: narrow), wide after ``rename``."""

    width = 2

    def decision(self, key: bytes, data: st.DataObject) -> Any:
        return data.draw(one_destination(key))

    def many(self, key: bytes, i: int) -> Any:
        return ((key, i, "m"), (EXT, i | (i % 1500 + 1) << POS_SHIFT, "m") if i % 3 else DROPS[i % 2])


CompactTableVsDict.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None, suppress_health_check=list(HealthCheck))
test_a_compact_decision_table_answers_like_a_dict = CompactTableVsDict.TestCase
