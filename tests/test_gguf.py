"""The native GGUF reader against gguf-py (GGUFWriter writes, GGUFReader is the oracle), plus
corrupt, truncated and split files. Every bad file must give FormatError naming the file."""
from __future__ import annotations

import math
import struct

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf import GGUFReader, GGUFValueType as VT, GGUFWriter

from pyrunner._native import FormatError, StrataError, ffi, lib
from pyrunner.gguf import GGUFFile, gguf_info

# ---------------------------------------------------------------------------- writing helpers

SCALARS = [  # (value type, value) with edge values
    (VT.UINT8, 255), (VT.INT8, -128), (VT.UINT16, 65535), (VT.INT16, -32768),
    (VT.UINT32, 2**32 - 1), (VT.INT32, -(2**31)), (VT.FLOAT32, 1.5), (VT.BOOL, True),
    (VT.STRING, "héllo, wörld ✓"), (VT.UINT64, 2**64 - 1), (VT.INT64, -(2**63)), (VT.FLOAT64, -2.25e300),
]
ARRAYS = [  # (element type, values)
    (VT.UINT8, [0, 1, 255]), (VT.INT8, [-128, 0, 127]), (VT.UINT16, [1, 65535]), (VT.INT16, [-5, 7]),
    (VT.UINT32, [3, 2**32 - 1]), (VT.INT32, [-(2**31), 2**31 - 1]), (VT.FLOAT32, [0.5, -3.25, 1e30]),
    (VT.BOOL, [True, False, True]), (VT.UINT64, [15411308609579, 2**64 - 1]), (VT.INT64, [-(2**63), 1]),
    (VT.FLOAT64, [1e-300, 2.5]), (VT.STRING, ["", "a", "bc", "日本語", "x" * 300]),
]
NESTED = {  # written with GGUFWriter, which infers inner types (ints -> i32, floats -> f32)
    "test.nested.ints": [[1, 2, 3], [4], [5, 6]],
    "test.nested.strings": [["a", "bb"], ["ccc"], ["", "dd", "e"]],
    "test.nested.deep": [[[1.5, 2.5]], [[3.5], [4.5, 5.5]]],
}


def _writer(path, alignment=None, arch="test"):
    w = GGUFWriter(str(path), arch)
    if alignment is not None:
        w.add_custom_alignment(alignment)
    return w


def _finish(w):
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _add_metadata(w):
    for vt, v in SCALARS:
        w.add_key_value(f"test.scalar.{vt.name.lower()}", v, vt)
    for vt, v in ARRAYS:
        w.add_key_value(f"test.array.{vt.name.lower()}", v, VT.ARRAY, sub_type=vt)
    for k, v in NESTED.items():
        w.add_key_value(k, v, VT.ARRAY)


def _add_tensors(w, rng, prefix=""):
    """F32, F16, I32, Q8_0, Q4_0, Q4_K, Q6_K tensors of 1..4 dims (quantized as random bytes)."""
    w.add_tensor(prefix + "f32.4d", rng.standard_normal((2, 3, 4, 8)).astype(np.float32))
    w.add_tensor(prefix + "f16.2d", rng.standard_normal((5, 16)).astype(np.float16))
    w.add_tensor(prefix + "i32.1d", rng.integers(-100, 100, 7).astype(np.int32))
    for qt, bs, ts, shape in [(QT.Q8_0, 32, 34, (3, 64)), (QT.Q4_0, 32, 18, (2, 32)),
                              (QT.Q4_K, 256, 144, (4, 512)), (QT.Q6_K, 256, 210, (2, 3, 256))]:
        nbytes = shape[-1] // bs * ts
        raw = rng.integers(0, 256, (*shape[:-1], nbytes), dtype=np.uint8)
        w.add_tensor(prefix + f"{qt.name.lower()}.{len(shape)}d", raw, raw_dtype=qt)


def _flatten(v):
    if isinstance(v, list):
        return [y for x in v for y in _flatten(x)]
    return [v]


def _check_against_reader(path, info, first_split_only=False):
    """Metadata and tensors of `info` (gguf_info) equal what GGUFReader reads from path."""
    r = GGUFReader(str(path))
    fields = {k: f for k, f in r.fields.items() if not k.startswith("GGUF.")}
    assert list(info["metadata"]) == list(fields)
    for k, f in fields.items():
        ours = info["metadata"][k]
        ref = f.contents()
        if isinstance(ours, list):  # GGUFReader flattens nested arrays
            assert _flatten(ours) == ref, k
        else:
            assert ours == ref, k
    tensors = [t for t in info["tensors"] if t.get("split", 0) == 0] if first_split_only else info["tensors"]
    assert len(tensors) == len(r.tensors)
    for ours, ref in zip(tensors, r.tensors):
        assert ours["name"] == ref.name
        assert ours["type"] == ref.tensor_type.name
        assert ours["shape"] == [int(d) for d in ref.shape]
        assert ours["offset"] == ref.data_offset
        assert ours["size"] == ref.n_bytes
    return r


# ---------------------------------------------------------------------------- valid files

def test_every_type_matches_gguf_reader(tmp_path):
    path = tmp_path / "all.gguf"
    w = _writer(path)
    _add_metadata(w)
    _add_tensors(w, np.random.default_rng(0))
    _finish(w)

    info = gguf_info(path)
    r = _check_against_reader(path, info)
    md = info["metadata"]
    for vt, v in SCALARS:
        got = md[f"test.scalar.{vt.name.lower()}"]
        assert got == (np.float32(v).item() if vt == VT.FLOAT32 else v)
    for vt, v in ARRAYS:
        got = md[f"test.array.{vt.name.lower()}"]
        assert got == ([np.float32(x).item() for x in v] if vt == VT.FLOAT32 else v)
    for k, v in NESTED.items():
        assert md[k] == v  # structure kept, not flattened
    assert "split" not in info["tensors"][0]

    f = GGUFFile(path)
    assert f.version == 3 and f.n_splits == 1 and f.alignment == 32
    assert lib.strata_gguf_data_offset(f._g, 0) == r.data_offset
    for t in r.tensors:  # the bytes come straight from the mapping
        assert bytes(f.tensor_data(t.name)) == t.data.tobytes()


def test_array_get_every_element_type(tmp_path):
    """strata_gguf_array_get on every element type, nested included: types, counts, offsets."""
    path = tmp_path / "arr.gguf"
    w = _writer(path)
    _add_metadata(w)
    _finish(w)
    f = GGUFFile(path)
    r = GGUFReader(str(path))
    idx = ffi.new("int64_t *")
    val = ffi.new("strata_gguf_value *")
    el = ffi.new("strata_gguf_value *")
    for vt, v in ARRAYS:
        key = f"test.array.{vt.name.lower()}"
        lib.strata_gguf_find_kv(f._g, key.encode(), idx)
        assert lib.strata_gguf_kv(f._g, idx[0], ffi.NULL, ffi.NULL, val) == 0
        assert (val.type, val.elem_type, val.count) == (VT.ARRAY, vt, len(v))
        field = r.fields[key]
        for i in range(len(v)):
            assert lib.strata_gguf_array_get(f._g, val, i, el) == 0
            assert el.type == vt
            part = field.parts[field.data[i]]
            if vt == VT.STRING:  # offset of the length field, then the bytes
                assert el.count == len(part) and ffi.unpack(ffi.cast("char *", el.data), el.count) == part.tobytes()
                assert el.offset + 8 == field.offset + sum(p.nbytes for p in field.parts[:field.data[i]])
            else:
                assert el.count == 1 and ffi.unpack(ffi.cast("char *", el.data), part.nbytes) == part.tobytes()
        assert lib.strata_gguf_array_get(f._g, val, len(v), el) == lib.STRATA_ERR_INVALID_ARG
    # nested: walk [[[1.5, 2.5]], [[3.5], [4.5, 5.5]]] through array_get
    lib.strata_gguf_find_kv(f._g, b"test.nested.deep", idx)
    lib.strata_gguf_kv(f._g, idx[0], ffi.NULL, ffi.NULL, val)
    assert (val.elem_type, val.count, val.data) == (VT.ARRAY, 2, ffi.NULL)
    assert lib.strata_gguf_array_get(f._g, val, 1, el) == 0
    assert (el.type, el.elem_type, el.count) == (VT.ARRAY, VT.ARRAY, 2)
    inner = ffi.new("strata_gguf_value *")
    assert lib.strata_gguf_array_get(f._g, el, 1, inner) == 0
    assert (inner.type, inner.elem_type, inner.count) == (VT.ARRAY, VT.FLOAT32, 2)
    assert list(np.frombuffer(ffi.buffer(inner.data, 8), "<f4")) == [4.5, 5.5]


def test_version_2(tmp_path):
    path = tmp_path / "v3.gguf"
    w = _writer(path)
    _add_metadata(w)
    _add_tensors(w, np.random.default_rng(1))
    _finish(w)
    data = bytearray(path.read_bytes())
    data[4:8] = struct.pack("<I", 2)
    v2 = tmp_path / "v2.gguf"
    v2.write_bytes(data)
    info2 = gguf_info(v2)
    _check_against_reader(v2, info2)
    assert info2 == gguf_info(path)
    assert GGUFFile(v2).version == 2


@pytest.mark.parametrize("alignment", [1, 8, 64, 4096])
def test_custom_alignment(tmp_path, alignment):
    path = tmp_path / f"a{alignment}.gguf"
    w = _writer(path, alignment=alignment)
    w.add_string("general.name", "aligned")
    _add_tensors(w, np.random.default_rng(2))
    _finish(w)
    info = gguf_info(path)
    r = _check_against_reader(path, info)
    f = GGUFFile(path)
    assert f.alignment == alignment
    assert lib.strata_gguf_data_offset(f._g, 0) == r.data_offset
    assert r.data_offset % alignment == 0
    assert all((t["offset"] - r.data_offset) % alignment == 0 for t in info["tensors"])


def test_empty_array_and_zero_sized_tensor(tmp_path):
    """GGUF allows count-0 arrays and ne = 0 (an empty tensor, as ggml and gguf-py do)."""
    b = RawGGUF()
    b.kv("test.empty", VT.ARRAY, struct.pack("<IQ", VT.STRING, 0))
    b.kv("test.empty_u8", VT.ARRAY, struct.pack("<IQ", VT.UINT8, 0))
    b.kv("test.empty_nested", VT.ARRAY, struct.pack("<IQ", VT.ARRAY, 2) + struct.pack("<IQ", VT.INT64, 0) * 2)
    b.tensor("empty", [0, 4], QT.F32, 0)
    b.tensor("one", [4], QT.F32, 0)
    path = b.write(tmp_path / "empty.gguf", data=b"\0" * 16)
    info = gguf_info(path)
    _check_against_reader(path, info)
    assert info["metadata"]["test.empty"] == [] and info["metadata"]["test.empty_nested"] == [[], []]
    assert info["tensors"][0]["size"] == 0 and info["tensors"][1]["size"] == 16


def test_find_and_lookup_errors(tmp_path):
    path = tmp_path / "f.gguf"
    w = _writer(path)
    _add_tensors(w, np.random.default_rng(3))
    _finish(w)
    f = GGUFFile(path)
    idx = ffi.new("int64_t *")
    assert lib.strata_gguf_find_tensor(f._g, b"q4_k.2d", idx) == 0
    t = ffi.new("strata_gguf_tensor *")
    lib.strata_gguf_tensor_info(f._g, idx[0], t)
    assert ffi.unpack(t.name, t.name_len) == b"q4_k.2d" and (t.ne[0], t.ne[1], t.ne[2], t.ne[3]) == (512, 4, 1, 1)
    assert lib.strata_gguf_find_tensor(f._g, b"nope", idx) == lib.STRATA_ERR_NOT_FOUND
    assert lib.strata_gguf_find_kv(f._g, b"general.architecture", idx) == 0
    assert lib.strata_gguf_find_kv(f._g, b"general", idx) == lib.STRATA_ERR_NOT_FOUND
    assert lib.strata_gguf_tensor_info(f._g, 99, t) == lib.STRATA_ERR_INVALID_ARG
    with pytest.raises(StrataError) as e:
        GGUFFile(tmp_path / "missing.gguf")
    assert e.value.status == lib.STRATA_ERR_IO and "missing.gguf" in str(e.value)


# ---------------------------------------------------------------------------- split models

def _write_split(tmp_path, n=3, tensors_per=(2, 1, 3), keys=None, names=None, stem="model"):
    """Shards written with GGUFWriter and the split.* keys as gguf-split writes them."""
    rng = np.random.default_rng(4)
    keys = keys or {}
    total = sum(tensors_per)
    paths, k = [], 0
    for i in range(n):
        p = tmp_path / (names[i] if names else f"{stem}-{i + 1:05d}-of-{n:05d}.gguf")
        w = GGUFWriter(str(p), "test") if i == 0 else _bare_writer(p)
        if i == 0:
            w.add_string("general.name", "split test")
            w.add_key_value("tokenizer.ggml.tokens", ["a", "b", "c"], VT.ARRAY, sub_type=VT.STRING)
        no, cnt, tot = keys.get(i, (i, n, total))
        if no is not None:
            w.add_key_value("split.no", no, VT.UINT16)
        if cnt is not None:
            w.add_key_value("split.count", cnt, VT.UINT16)
        if tot is not None:
            w.add_key_value("split.tensors.count", tot, VT.INT32)
        for j in range(tensors_per[i]):
            name = f"blk.{k}.weight"
            w.add_tensor(name, rng.standard_normal((2, 32 * (j + 1))).astype(np.float32))
            k += 1
        _finish(w)
        paths.append(p)
    return paths


def _bare_writer(path):
    w = GGUFWriter(str(path), "test")
    w.kv_data[0].clear()  # shards after the first carry only the split keys
    return w


def test_split_model(tmp_path):
    paths = _write_split(tmp_path)
    f = GGUFFile(paths[0])
    assert f.n_splits == 3
    info = gguf_info(paths[0])
    _check_against_reader(paths[0], info, first_split_only=True)
    assert info["metadata"]["split.count"] == 3 and info["metadata"]["tokenizer.ggml.tokens"] == ["a", "b", "c"]
    assert [t["split"] for t in info["tensors"]] == [0, 0, 1, 2, 2, 2]
    assert [t["name"] for t in info["tensors"]] == [f"blk.{i}.weight" for i in range(6)]
    for i, p in enumerate(paths):
        r = GGUFReader(str(p))
        ours = [t for t in info["tensors"] if t["split"] == i]
        assert [(t["name"], t["offset"], t["size"]) for t in ours] == \
               [(t.name, t.data_offset, t.n_bytes) for t in r.tensors]
        assert lib.strata_gguf_data_offset(f._g, i) == r.data_offset
        for t in r.tensors:
            assert bytes(f.tensor_data(t.name)) == t.data.tobytes()


def _expect_format_error(path, *needles, opener=GGUFFile):
    with pytest.raises(FormatError) as e:
        opener(path)
    msg = str(e.value)
    for n in needles:
        assert n in msg, msg
    return msg


def test_truncated_split_names_the_short_file(tmp_path):
    """A shard cut inside its tensor data: the message names that shard and both sizes."""
    paths = _write_split(tmp_path)
    data = paths[1].read_bytes()
    need = max(t.data_offset + t.n_bytes for t in GGUFReader(str(paths[1])).tensors)
    paths[1].write_bytes(data[:need - 10])
    msg = _expect_format_error(paths[0], f"{paths[1]}: the file has {need - 10} bytes, its tensors need {need}: "
                                         "the copy is incomplete (download it again)")
    assert str(paths[0]) not in msg


def test_split_errors(tmp_path):
    d = tmp_path / "missing"
    d.mkdir()
    paths = _write_split(d)
    paths[1].unlink()
    with pytest.raises(StrataError) as e:
        GGUFFile(paths[0])
    assert e.value.status == lib.STRATA_ERR_IO and paths[1].name in str(e.value)

    d = tmp_path / "second"
    d.mkdir()
    paths = _write_split(d)
    _expect_format_error(paths[1], paths[1].name, "split 2 of 3", "model-00001-of-00003.gguf")

    for sub, kw, needles in [
        ("no", dict(keys={1: (2, 3, 6)}), ["model-00002-of-00003.gguf", "split.no is 2"]),
        ("count", dict(keys={2: (2, 4, 6)}), ["model-00003-of-00003.gguf", "split.count is 4"]),
        ("total", dict(keys={i: (i, 3, 7) for i in range(3)}), ["model-00001-of-00003.gguf", "split.tensors.count is 7"]),
        ("totals_differ", dict(keys={2: (2, 3, 5)}), ["model-00003-of-00003.gguf", "split.tensors.count is 5"]),
        ("nocount", dict(keys={1: (1, None, 6)}), ["model-00002-of-00003.gguf", "split.count is missing"]),
        ("name", dict(names=["a.gguf", "b.gguf", "c.gguf"]), ["a.gguf", "file name"]),
    ]:
        d = tmp_path / sub
        d.mkdir()
        paths = _write_split(d, **kw)
        _expect_format_error(paths[0], *needles)

    # duplicate tensor names across splits: write shard 3 with a name shard 1 already has
    d = tmp_path / "dup"
    d.mkdir()
    paths = _write_split(d)
    w = _bare_writer(paths[2])
    for k, v, t in [("split.no", 2, VT.UINT16), ("split.count", 3, VT.UINT16), ("split.tensors.count", 6, VT.INT32)]:
        w.add_key_value(k, v, t)
    for name in ["blk.3.weight", "blk.0.weight", "blk.5.weight"]:
        w.add_tensor(name, np.zeros((2, 32), np.float32))
    _finish(w)
    _expect_format_error(paths[0], "model-00003-of-00003.gguf", "'blk.0.weight'", "duplicate name",
                         "model-00001-of-00003.gguf")


# ---------------------------------------------------------------------------- corrupt files

class RawGGUF:
    """Builds GGUF bytes field by field, so any field can be made wrong."""

    def __init__(self, version=3):
        self.version = version
        self.kvs: list[bytes] = []
        self.infos: list[bytes] = []
        self.n_kv = self.n_tensors = None

    @staticmethod
    def s(b):
        b = b.encode() if isinstance(b, str) else b
        return struct.pack("<Q", len(b)) + b

    def kv(self, key, vtype, payload):
        self.kvs.append(self.s(key) + struct.pack("<I", vtype) + payload)
        return self

    def tensor(self, name, ne, qtype, offset, n_dims=None):
        self.infos.append(self.s(name) + struct.pack("<I", len(ne) if n_dims is None else n_dims)
                          + b"".join(struct.pack("<Q", d) for d in ne) + struct.pack("<IQ", qtype, offset))
        return self

    def build(self, data=b"", alignment=32):
        head = b"GGUF" + struct.pack("<IQQ", self.version,
                                     len(self.infos) if self.n_tensors is None else self.n_tensors,
                                     len(self.kvs) if self.n_kv is None else self.n_kv)
        body = head + b"".join(self.kvs) + b"".join(self.infos)
        body += b"\0" * (-len(body) % alignment)
        return body + data

    def write(self, path, data=b"", alignment=32):
        path.write_bytes(self.build(data, alignment))
        return path


def _ok_base():
    return RawGGUF().kv("general.architecture", VT.STRING, RawGGUF.s("test"))


CORRUPT = {
    # name: (builder -> bytes, substrings the message must contain)
    "bad_magic": (lambda: b"GGUX" + _ok_base().build()[4:], ["not a GGUF file", "47 47 55 58"]),
    "short_magic": (lambda: b"GG", ["ends after 2 bytes [47 47]", "cut short"]),
    "short_not_magic": (lambda: b"GX", ["not a GGUF file", "and ends there"]),
    "version_1": (lambda: RawGGUF(version=1).build(), ["version 1 is not supported"]),
    "version_4": (lambda: RawGGUF(version=4).build(), ["unknown GGUF version 4"]),
    "big_endian": (lambda: b"GGUF" + struct.pack(">I", 3) + _ok_base().build()[8:], ["big-endian"]),
    "huge_kv_count": (lambda: _set(_ok_base(), n_kv=2**63), ["kv count 9223372036854775808"]),
    "huge_tensor_count": (lambda: _set(_ok_base(), n_tensors=2**64 - 1), ["tensor count 18446744073709551615"]),
    "key_length_past_end": (lambda: _ok_base().build()[:24] + struct.pack("<Q", 1000) + b"abc" * 10,
                            ["kv 0", "key length 1000"]),
    "string_length_past_end": (lambda: _ok_base().kv("general.name", VT.STRING, struct.pack("<Q", 2**63) + b"x").build(),
                               ["kv 1 'general.name'", "string length 9223372036854775808"]),
    "empty_key": (lambda: _ok_base().kv("", VT.UINT8, b"\1").build(), ["kv 1", "key is empty"]),
    "nul_in_key": (lambda: _ok_base().kv("a\0b", VT.UINT8, b"\1").build(), ["NUL"]),
    "duplicate_key": (lambda: _ok_base().kv("general.architecture", VT.UINT8, b"\1").build(),
                      ["kv 1 'general.architecture'", "duplicate key"]),
    "unknown_value_type": (lambda: _ok_base().kv("x.y", 13, b"\0" * 8).build(), ["kv 1 'x.y'", "unknown value type 13"]),
    "unknown_element_type": (lambda: _ok_base().kv("x.y", VT.ARRAY, struct.pack("<IQ", 99, 1) + b"\0" * 8).build(),
                             ["element type 99"]),
    "array_count_overflow": (lambda: _ok_base().kv("x.y", VT.ARRAY, struct.pack("<IQ", VT.UINT64, 2**61 + 1)).build(),
                             ["kv 1 'x.y'", "array count 2305843009213693953"]),
    "string_array_count": (lambda: _ok_base().kv("x.y", VT.ARRAY, struct.pack("<IQ", VT.STRING, 2**62)).build(),
                           ["array count 4611686018427387904"]),
    "string_in_array_past_end": (
        lambda: _ok_base().kv("x.y", VT.ARRAY, struct.pack("<IQ", VT.STRING, 2) + RawGGUF.s("ok")
                              + struct.pack("<Q", 500) + b"zz").build(), ["kv 1 'x.y'[1]", "string length 500"]),
    "nested_too_deep": (lambda: _ok_base().kv("x.y", VT.ARRAY, struct.pack("<IQ", VT.ARRAY, 1) * 8
                                              + struct.pack("<IQ", VT.UINT8, 1) + b"\0").build(),
                        ["nested more than 8 deep"]),
    "bad_bool": (lambda: _ok_base().kv("x.b", VT.BOOL, b"\2").build(), ["kv 1 'x.b'", "not 0 or 1"]),
    "alignment_not_pow2": (lambda: _ok_base().kv("general.alignment", VT.UINT32, struct.pack("<I", 48)).build(),
                           ["general.alignment 48"]),
    "alignment_wrong_type": (lambda: _ok_base().kv("general.alignment", VT.UINT64, struct.pack("<Q", 64)).build(),
                             ["general.alignment must be a u32"]),
    "offset_past_end": (lambda: _ok_base().tensor("w", [8], QT.F32, 0).build(b"\0" * 31),
                        ["the file has", "its tensors need", "the copy is incomplete", "tensor 0 'w' ends there"]),
    "huge_offset": (lambda: _ok_base().tensor("w", [8], QT.F32, 2**64 - 32).build(b"\0" * 32),
                    ["tensor 0 'w'", "past the end"]),
    "misaligned_offset": (lambda: _ok_base().tensor("w", [8], QT.F32, 4).build(b"\0" * 64),
                          ["tensor 0 'w'", "not a multiple of the alignment 32"]),
    "dimension_overflow": (lambda: _ok_base().tensor("w", [2**32, 2**32], QT.F32, 0).build(b"\0" * 32),
                           ["tensor 0 'w'", "overflows int64"]),
    "byte_size_overflow": (lambda: _ok_base().tensor("w", [2**62], QT.I64, 0).build(b"\0" * 32),
                           ["tensor 0 'w'", "byte size"]),
    "negative_dim": (lambda: _ok_base().tensor("w", [2**63], QT.F32, 0).build(), ["ne[0]", "INT64_MAX"]),
    "too_many_dims": (lambda: _ok_base().tensor("w", [1, 1, 1, 1, 1], QT.F32, 0).build(b"\0" * 32),
                      ["tensor 0 'w'", "n_dims 5"]),
    "zero_dims": (lambda: _ok_base().tensor("w", [], QT.F32, 0).build(b"\0" * 32), ["n_dims 0"]),
    "unknown_type_id": (lambda: _ok_base().tensor("w", [32], 99, 0).build(b"\0" * 128),
                        ["tensor 0 'w'", "ggml type id 99"]),
    "removed_type_id": (lambda: _ok_base().tensor("w", [32], 4, 0).build(b"\0" * 128), ["tensor 0 'w'", "type id 4"]),
    "not_block_multiple": (lambda: _ok_base().tensor("w", [16, 2], QT.Q8_0, 0).build(b"\0" * 128),
                           ["tensor 0 'w'", "ne[0] = 16", "block size 32"]),
    "duplicate_tensor": (lambda: _ok_base().tensor("w", [8], QT.F32, 0).tensor("w", [8], QT.F32, 32).build(b"\0" * 64),
                         ["tensor 1 'w'", "duplicate name"]),
    "empty_tensor_name": (lambda: _ok_base().tensor("", [8], QT.F32, 0).build(b"\0" * 64), ["tensor 0", "name is empty"]),
    "tensor_name_past_end": (lambda: _tensor_name_past_end(), ["tensor 0", "name length 99"]),
}


def _tensor_name_past_end():
    """One tensor whose name length runs past the end of the file."""
    return b"GGUF" + struct.pack("<IQQ", 3, 1, 1) + _ok_base().kvs[0] + struct.pack("<Q", 99) + b"w" * 40


def _set(b, **kw):
    for k, v in kw.items():
        setattr(b, k, v)
    return b.build()


@pytest.mark.parametrize("case", sorted(CORRUPT))
def test_corrupt_file(tmp_path, case):
    build, needles = CORRUPT[case]
    path = tmp_path / f"corrupt_{case}.gguf"
    path.write_bytes(build())
    msg = _expect_format_error(path, path.name, "byte offset", *needles)
    # the same bytes through strata_gguf_open_memory name the caller's name
    data = path.read_bytes()
    out = ffi.new("strata_gguf **")
    assert lib.strata_gguf_open_memory(data, len(data), b"mem:" + case.encode(), out) == lib.STRATA_ERR_FORMAT
    assert ffi.string(lib.strata_last_error()).decode("utf-8", "replace") == msg.replace(str(path), "mem:" + case)


def test_empty_file(tmp_path):
    path = tmp_path / "empty.gguf"
    path.write_bytes(b"")
    _expect_format_error(path, "empty.gguf", "empty")


def _small_valid(tmp_path):
    path = tmp_path / "small.gguf"
    w = _writer(path)
    w.add_string("general.name", "tiny")
    w.add_key_value("test.strs", ["ab", "", "c"], VT.ARRAY, sub_type=VT.STRING)
    w.add_key_value("test.nest", [[1, 2], [3]], VT.ARRAY)
    w.add_key_value("test.f64", 0.25, VT.FLOAT64)
    w.add_key_value("test.flag", True, VT.BOOL)
    w.add_tensor("a", np.arange(8, dtype=np.float32))
    w.add_tensor("b", np.zeros((1, 34), np.uint8), raw_dtype=QT.Q8_0)
    _finish(w)
    return path


def test_truncation_at_every_byte(tmp_path):
    """Cutting the file anywhere before the end of the last tensor's data is a FormatError
    naming the file and saying it is cut short (a cut inside the magic or into a count may also
    be another file or a corrupt field, and says so); cutting only the trailing padding still
    opens."""
    src = _small_valid(tmp_path)
    data = src.read_bytes()
    info = gguf_info(src)
    end = max(t["offset"] + t["size"] for t in info["tensors"])
    assert end < len(data)  # the writer padded after the last tensor
    cut = tmp_path / "cut.gguf"
    out = ffi.new("strata_gguf **")
    for n in range(len(data)):
        cut.write_bytes(data[:n])
        if n < end:
            msg = _expect_format_error(cut, "cut.gguf")
            if n == 0:
                assert "the file is empty" in msg
            elif n >= info["tensors"][0]["offset"]:    # the header is whole, the data is not
                assert f"the file has {n} bytes, its tensors need {end}: the copy is incomplete" in msg, msg
            else:                                      # inside the header, or in the padding after it
                assert "cut short" in msg or f"its tensors need {end}: the copy is incomplete" in msg, msg
            assert lib.strata_gguf_open_memory(data[:n], n, b"cut", out) == lib.STRATA_ERR_FORMAT
        else:
            assert gguf_info(cut) == info


def test_bit_flips_never_crash(tmp_path):
    """Every single-byte corruption of the header area opens or fails cleanly (the fuzzer
    goes further; this runs everywhere)."""
    data = bytearray(_small_valid(tmp_path).read_bytes())
    info_end = GGUFReader(str(tmp_path / "small.gguf")).data_offset
    out = ffi.new("strata_gguf **")
    for i in range(info_end):
        for v in (0x00, 0xff, data[i] ^ 0x80):
            d = bytearray(data)
            d[i] = v
            st = lib.strata_gguf_open_memory(bytes(d), len(d), b"flip", out)
            assert st in (lib.STRATA_OK, lib.STRATA_ERR_FORMAT)
            if st == lib.STRATA_OK:
                lib.strata_gguf_close(out[0])
            else:
                assert ffi.string(lib.strata_last_error()).startswith(b"flip: ")


def test_float_specials_roundtrip(tmp_path):
    path = tmp_path / "nan.gguf"
    w = _writer(path)
    w.add_key_value("x.nan", float("nan"), VT.FLOAT32)
    w.add_key_value("x.inf", [float("inf"), -0.0], VT.ARRAY, sub_type=VT.FLOAT64)
    _finish(w)
    md = gguf_info(path)["metadata"]
    assert math.isnan(md["x.nan"]) and md["x.inf"][0] == math.inf and math.copysign(1, md["x.inf"][1]) == -1


def test_tensor_data_keeps_the_mapping_alive(tmp_path):
    # A view of a tensor must stay valid after the GGUFFile object itself is dropped.
    import gc

    path = tmp_path / "alive.gguf"
    data = np.arange(4096, dtype=np.float32)
    w = _writer(path)
    w.add_tensor("t", data)
    _finish(w)
    view = GGUFFile(path).tensor_data("t")
    gc.collect()
    assert view.readonly
    assert np.array_equal(np.frombuffer(bytes(view), dtype=np.float32), data)
