"""The restricted pickle machine in C++ (``restricted_load``, cpp/bindings/
restricted_pickle.cc) against the Python reference it replaced
(reference_unpickler.py): on every hostile pickle of the DCP tests, on thousands of
random mutations of real ``.metadata`` files written by torch.distributed.checkpoint
and of the ``data.pkl`` of their tensor items, and on generated opcode streams, both
give equal values or both refuse with the same message."""

from __future__ import annotations

import io
import os
import pickle
import random
import struct
import sys
import zipfile
from typing import Any, Callable

import pytest

from pyckpt.codecs.distcp.allowed import ARCHIVE_GLOBALS, METADATA_GLOBALS, Rebuild
from pyckpt.codecs.distcp.archive import _persistent
from pyckpt.codecs.distcp.unpickler import Global, Obj, restricted_load
from pyckpt.errors import CorruptCheckpointError

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, os.pardir, os.pardir, "fuzz"))
import hostile_open  # noqa: E402
from mutations import mutate  # noqa: E402
from reference_unpickler import reference_load  # noqa: E402

CKPT = os.path.join(HERE, "fixtures", "ckpt")


def _same(a: Any, b: Any, seen: set[tuple[int, int]]) -> bool:
    """Structural equality of two loaded values (records by class, name and state;
    shared parts compared once; floats bit for bit)."""
    if type(a) is not type(b):
        return False
    if (id(a), id(b)) in seen:
        return True
    if isinstance(a, (tuple, list, dict, Obj, Global, Rebuild)):
        seen.add((id(a), id(b)))
    if type(a) is float:
        return struct.pack("<d", a) == struct.pack("<d", b)
    if isinstance(a, Obj):
        return a.cls == b.cls and _same(a.args, b.args, seen) and _same(a.state, b.state, seen)
    if isinstance(a, Global):
        return (a.module, a.name, a.kind, a.call) == (b.module, b.name, b.kind, b.call)
    if isinstance(a, Rebuild):
        return a.fn == b.fn and _same(a.args, b.args, seen)
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y, seen) for x, y in zip(a, b))
    if isinstance(a, dict):
        return len(a) == len(b) and all(
            _same(ka, kb, seen) and _same(va, vb, seen)
            for (ka, va), (kb, vb) in zip(a.items(), b.items()))
    return bool(a == b)


def _outcome(load: Callable[..., Any], data: bytes, **kw: Any) -> tuple[str, Any]:
    try:
        return "value", load(data, where="t", **kw)
    except CorruptCheckpointError as e:
        return "refused", str(e)


def agree(data: bytes, allowed: dict = METADATA_GLOBALS, **kw: Any) -> str:
    """Checks both machines on ``data``: "value" or "refused"."""
    got = _outcome(restricted_load, data, allowed=allowed, **kw)
    want = _outcome(reference_load, data, allowed=allowed, **kw)
    assert got[0] == want[0], (data[:200], got, want)
    if got[0] == "refused":
        assert got[1] == want[1], data[:200]
    else:
        assert _same(got[1], want[1], set()), data[:200]
    return got[0]


@pytest.fixture(scope="module")
def torch_written(tmp_path_factory) -> list[bytes]:
    """``.metadata`` files written by torch.distributed.checkpoint itself (this
    process, no process group): the committed fixture's and a fresh one of several
    dtypes, shapes and non-tensor values."""
    out = [open(os.path.join(CKPT, ".metadata"), "rb").read()]
    torch = pytest.importorskip("torch")
    import torch.distributed.checkpoint as dcp
    d = str(tmp_path_factory.mktemp("dcp"))
    state = {"w": torch.arange(12, dtype=torch.float32).reshape(3, 4),
             "b": torch.ones(5, dtype=torch.bfloat16), "i": torch.tensor([1, -2], dtype=torch.int64),
             "flag": torch.tensor(True), "step": 7, "name": "run-\u00e9", "cfg": {"lr": 0.5}}
    dcp.save(state, checkpoint_id=d)
    out.append(open(os.path.join(d, ".metadata"), "rb").read())
    return out


def _data_pkls() -> list[bytes]:
    """The data.pkl of every item of the committed fixture (torch.save archives)."""
    out = []
    for name in sorted(os.listdir(CKPT)):
        if not name.endswith(".distcp"):
            continue
        raw = open(os.path.join(CKPT, name), "rb").read()
        at = 0
        while (start := raw.find(b"PK\x03\x04", at)) >= 0:
            end = raw.find(b"PK\x05\x06", start)
            if end < 0:
                break
            try:
                with zipfile.ZipFile(io.BytesIO(raw[start:end + 22])) as z:
                    out += [z.read(n) for n in z.namelist() if n.endswith("data.pkl")]
            except (zipfile.BadZipFile, ValueError):
                pass
            at = end + 22
    return out


# -- hostile pickles ------------------------------------------------------------------------

_FIXED = [
    b"\x80\x02cos\nsystem\n.", b"\x80\x02}q\xff\xff\xff\xff.", b"\x80\x02Nr\xff\xff\xff\x7f.",
    b"\x80\x02c__builtin__\nset\n)R.", b"\x80\x02]i__main__\nX\n.", b"\x80\x02\x82\x01.",
    b"\x80\x02(]]d.", b"\x80\x02\x8b\x00\x00\x01\x00" + b"\x01" * 65536 + b".",
    b"\x80\x02X\xff\xff\xff\x7fab.", b"\x80\x02ctorch\nSize\nK\x01\x85R.",
    b"\x80\x02ctorch\nfloat32\n)R.", b"\x80\x02N", b"\x80\x02N.junk", b"\x80\x02.",
    b"\x80\x02cbuiltins\nexec\nq\x00X\x04\x00\x00\x00pass" + b"q\x01\x85q\x02R.",
    b"\x80\x06N.", b"\x80\x01N.", b"\x80\x02h\x05.", b"\x80\x02\x94.", b"\x80\x02N(\x94.",
    b"\x80\x02(N\x94h\x00.", b"\x80\x02(Nq\x00.", b"\x80\x02N(0.", b"\x80\x02N(2.",
    b"\x80\x02]N(a.", b"\x80\x02](Na.", b"\x80\x02](Ne.", b"\x80\x02}(NNs.", b"\x80\x02}N(Ns.",
    b"\x80\x02q\x05.", b"\x80\x02Nq\x05N\x94\x94\x94\x94\x94N\x94h\x05h\x06.",
    b"\x80\x02X\x02\x00\x00\x00\xed\xa0.", b"\x80\x02X\x03\x00\x00\x00\xed\xa0\x80.",
    b"\x80\x02\x8c\x03\xed\xa0\x80\x8c\x01x\x93.", b"\x80\x02G\x7f\xf8\x00\x00\x00\x00\x00\x01.",
    b"\x80\x02\x8a\x00.", b"\x80\x02\x8a\x02\xff\x7f.", b"\x80\x02\x8a\x01", b"\x80\x02J\xff\xff.",
    b"\x80\x02ctorch\nfloat32", b"\x80\x02c" + b"a" * 2000 + b"\n.",
    b"\x80\x02c\xff\xfe\nx\n.", b"\x80\x02ccollections\nOrderedDict\n)R(K\x01K\x02u.",
    b"\x80\x02ccollections\nOrderedDict\nK\x01\x85R.",
    b"\x80\x02ctorch.distributed.checkpoint.metadata\nMetadata\n)\x81Nb}b.",
    b"\x80\x02ctorch.distributed.checkpoint.metadata\nMetadata\n)}\x92}b.",
    b"\x80\x02ctorch.distributed.checkpoint.metadata\nMetadata\n)}(NNu\x92.",
    b"\x80\x02ctorch\nfloat32\n)\x81.", b"\x80\x02N)\x81.", b"\x80\x02NNb.", b"\x80\x02K\x01Q.",
    b"\x80\x02\x95\x01\x00\x00\x00\x00\x00\x00\x00N.", b"\x80\x02\x95\x01\x00.",
    b"\x80\x02ctorch.serialization\n_get_layout\nX\x0c\x00\x00\x00torch.stridedq\x00\x85R.",
    b"\x80\x02cpathlib\nPosixPath\nX\x01\x00\x00\x00a\x8c\x01bq\x00\x86R.",
    b"\x80\x02cpathlib\nPosixPath\nK\x01\x85R.", b"\x80\x02ctorch\nSize\n]K\x01a\x85R.",
]


def _key_bodies() -> list[bytes]:
    big = (1 << 61) - 2
    return [b"\x80\x02}(" + body + b"u." for body in [
        b"X\x01\x00\x00\x00aK\x01C\x01bK\x02NK\x03\x88K\x04K\x05K\x06",
        b"\x8a\x08" + big.to_bytes(8, "little", signed=True) + b"N",
        b"\x8a\x08" + (big + 1).to_bytes(8, "little", signed=True) + b"N",
        b"\x8a\x08" + (-big - 1).to_bytes(8, "little", signed=True) + b"N",
        b"K\x01K\x02\x86N", b"G" + b"\x3f\xf8" + b"\x00" * 6 + b"N",
        b"X\x01\x00\x00\x00aNX\x01\x00\x00\x00aN", b"K\x01N\x88N", b"]N", b"K\x01",
        b"ctorch\nfloat32\nNctorch\nfloat32\nN"]]


def test_hostile_pickles_agree():
    for data in _FIXED + _key_bodies():
        agree(data)
        agree(data, ARCHIVE_GLOBALS, persistent=_persistent)


@pytest.mark.parametrize("case", [c for c in hostile_open.CASES if c[3] == "dcp"],
                         ids=lambda c: c[0])
def test_hostile_open_cases_agree(case):
    """fuzz/hostile_open.py's DCP cases, a tenth of their size (the reference is slow)."""
    _, _, build, _, needs_torch = case
    if needs_torch:
        pytest.importorskip("torch")
    agree(build(0.1))


def test_torch_written_metadata_agrees(torch_written):
    for data in torch_written:
        assert agree(data) == "value"
        value = pickle.loads(data)
        for proto in (2, 3, 4, 5):  # the same records at every protocol pickle writes
            assert agree(pickle.dumps(value, protocol=proto)) == "value"


class _Evil:
    def __reduce__(self):
        return (os.system, ("true",))


def test_metadata_holding_a_reduce_deep_inside_agrees(torch_written):
    """test_hostile.py's real metadata whose planner_data would run a command."""
    md = pickle.loads(torch_written[1])
    md.planner_data = {"w": _Evil()}
    assert agree(pickle.dumps(md)) == "refused"


def test_mutated_metadata_agrees(torch_written):
    rng = random.Random(37)
    outcomes = {"value": 0, "refused": 0}
    for n in range(3000):
        outcomes[agree(mutate(torch_written[n % len(torch_written)], rng))] += 1
    assert outcomes["value"] > 30 and outcomes["refused"] > 1000, outcomes


def test_mutated_data_pkls_agree():
    pkls = _data_pkls()
    assert pkls
    rng = random.Random(38)
    opened = [agree(data, ARCHIVE_GLOBALS, persistent=_persistent) for data in pkls]
    assert opened.count("value") >= len(pkls) // 2  # (bytes entries hold other objects)
    for n in range(1500):
        agree(mutate(pkls[n % len(pkls)], rng), ARCHIVE_GLOBALS, persistent=_persistent)


_OPS = [b"(", b")", b"]", b"}", b"N", b"\x88", b"\x89", b"K\x01", b"M\x01\x00", b"J\xff\xff\xff\xff",
        b"\x8a\x02\xff\x7f", b"\x8c\x01a", b"X\x01\x00\x00\x00b", b"C\x02xy", b"B\x01\x00\x00\x00z",
        b"t", b"\x85", b"\x86", b"\x87", b"a", b"e", b"s", b"u", b"d", b"l", b"0", b"1", b"2",
        b"\x94", b"q\x00", b"h\x00", b"r\x05\x00\x00\x00", b"j\x05\x00\x00\x00", b"h\x01", b"R",
        b"\x81", b"b", b"Q", b"\x92", b"\x8c\x05torch\x8c\x04Size\x93", b"ctorch\nfloat32\n",
        b"ctorch._utils\n_rebuild_tensor_v2\n", b"ctorch\nFloatStorage\n",
        b"\x8c&torch.distributed.checkpoint.metadata\x8c\x08Metadata\x93", b"cos\nsystem\n",
        b"ccollections\nOrderedDict\n", b"cpathlib\nPosixPath\n", b"\x8c\x07storage",
        b"\x95\x00\x00\x00\x00\x00\x00\x00\x00", b"G\x3f\xf0\x00\x00\x00\x00\x00\x00", b"\xff",
        b"i", b"\x82\x01", b"."]


def test_generated_opcode_streams_agree():
    rng = random.Random(39)
    for _ in range(4000):
        data = b"\x80\x04" + b"".join(rng.choice(_OPS) for _ in range(rng.randint(1, 40)))
        if rng.random() < 0.8:
            data += b"."
        agree(data)
        agree(data, ARCHIVE_GLOBALS, persistent=_persistent)


def test_a_surrogate_in_a_refused_name_comes_back_as_it_was():
    """Names decoded with surrogatepass travel through the C++ message unchanged."""
    data = b"\x80\x02\x8c\x03\xed\xa0\x80\x8c\x01x\x93."
    with pytest.raises(CorruptCheckpointError) as e:
        restricted_load(data, METADATA_GLOBALS, where="t")
    assert "refused global \ud800.x" in str(e.value)


def test_a_callback_error_that_is_no_refusal_propagates():
    """A stand-in whose call fails for another reason (here a RuntimeError) is not
    turned into a refusal: the error comes out as it was raised."""
    def boom(args: tuple) -> Any:
        raise RuntimeError("boom")
    allowed = {("m", "f"): Global("m", "f", "function", boom)}
    with pytest.raises(RuntimeError, match="boom"):
        restricted_load(b"\x80\x02cm\nf\n)R.", allowed, where="t")


def test_torch_size_natively_and_through_its_function_agree():
    """torch.Size's call (``unpickler.int_tuple``) runs in the machine for a tuple or
    list of ints and through the Python function for anything else: both give the
    reference machine's value, or its refusal."""
    def size_of(arg: bytes) -> bytes:  # torch.Size(<arg>) by hand, protocol 2
        return b"\x80\x02ctorch\nSize\n" + arg + b"\x85R."
    ints = pickle.dumps((1, 2, 3), protocol=2)[2:-1]
    as_list = pickle.dumps([4, 5], protocol=2)[2:-1]
    with_bool = pickle.dumps((1, True), protocol=2)[2:-1]
    text = pickle.dumps("ab", protocol=2)[2:-1]
    empty = pickle.dumps((), protocol=2)[2:-1]
    outcomes = [agree(size_of(arg)) for arg in (ints, as_list, with_bool, text, empty)]
    assert outcomes[0] == "value" and outcomes[1] == "value" and outcomes[4] == "value"
    assert outcomes[2] == outcomes[3] == "refused"
    assert restricted_load(size_of(ints), METADATA_GLOBALS, where="t") == (1, 2, 3)
    assert restricted_load(size_of(as_list), METADATA_GLOBALS, where="t") == (4, 5)
