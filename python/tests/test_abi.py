"""The ctypes mirror of include/tport.h: every struct's size and every field's offset
against the C compiler's (a small program built here), and the same layouts through
libtport's own behaviour (tport_put_options_init, tport_ref_parse/format)."""
import ctypes
import os
import shutil
import subprocess

import pytest

from conftest import REPO
from tensorport import _lib

STRUCTS = {
    "tport_err": _lib.Err,
    "tport_ref": _lib.Ref,
    "tport_tensor_info": _lib.TensorInfoC,
    "tport_connect_options": _lib.ConnectOptions,
    "tport_put_options": _lib.PutOptions,
    "tport_to_options": _lib.ToOptions,
    "tport_device_info": _lib.DeviceInfoC,
    "tport_counter": _lib.CounterC,
    "tport_put_item": _lib.PutItem,
    "tport_get_item": _lib.GetItem,
    "DLDevice": _lib.DLDevice,
    "DLDataType": _lib.DLDataType,
    "DLTensor": _lib.DLTensor,
    "DLManagedTensor": _lib.DLManagedTensor,
}


def c_layout(tmp_path):
    """{struct: (sizeof, {field: offsetof})} printed by a program compiled against the headers."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler (build-essential is not installed)")
    lines = ["#include <stddef.h>", "#include <stdio.h>", '#include "tport.h"', "int main(void) {"]
    for cname, cls in STRUCTS.items():
        lines.append('printf("%s sizeof %%zu\\n", sizeof(%s));' % (cname, cname))
        for f, _ in cls._fields_:
            lines.append('printf("%s %s %%zu\\n", offsetof(%s, %s));' % (cname, f, cname, f))
    lines += ["return 0;", "}"]
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines) + "\n")
    exe = tmp_path / "layout"
    subprocess.run([cc, "-std=c11", "-I", os.path.join(REPO, "include"), str(src), "-o",
                    str(exe)], check=True)
    out = {}
    for line in subprocess.run([str(exe)], check=True, capture_output=True,
                               text=True).stdout.splitlines():
        s, f, v = line.split()
        size, fields = out.setdefault(s, [0, {}])
        if f == "sizeof":
            out[s][0] = int(v)
        else:
            fields[f] = int(v)
    return out


def test_struct_layouts_match_the_header(tmp_path):
    c = c_layout(tmp_path)
    for cname, cls in STRUCTS.items():
        size, fields = c[cname]
        assert ctypes.sizeof(cls) == size, cname
        for f, _ in cls._fields_:
            assert getattr(cls, f).offset == fields[f], "%s.%s" % (cname, f)


def test_every_declared_function_is_exported():
    lib = _lib.load()
    for name in _lib._PROTOTYPES:
        assert getattr(lib, name).argtypes is not None


def test_put_options_init_through_the_mirror():
    # Defaults: memory_format PRESERVE (3), everything else zero: a field at the
    # wrong offset would show a 3 somewhere else or a non-zero byte.
    o = _lib.PutOptions()
    ctypes.memset(ctypes.addressof(o), 0xAB, ctypes.sizeof(o))
    _lib.load().tport_put_options_init(ctypes.byref(o))
    assert o.memory_format == 3
    assert not o.name and not o.device and not o.progress and not o.progress_arg
    assert o.ttl_ms == 0 and not o.has_dtype and o.dtype == 0
    assert not o.managed and not o.non_blocking


def test_ref_parse_and_format_through_the_mirror():
    lib = _lib.load()
    r = _lib.Ref()
    err = _lib.Err()
    h = "00112233445566778899aabbccddeeff"
    assert lib.tport_ref_parse(h.encode(), ctypes.byref(r), ctypes.byref(err)) == 0
    assert bytes(r.handle).hex() == h and r.name == b""
    buf = ctypes.create_string_buffer(64)
    lib.tport_ref_format(ctypes.byref(r), buf, len(buf))
    assert buf.value.decode() == h
    assert lib.tport_ref_parse(b"some-name", ctypes.byref(r), ctypes.byref(err)) == 0
    assert bytes(r.handle) == bytes(16) and r.name == b"some-name"
    assert lib.tport_ref_parse(b"", ctypes.byref(r), ctypes.byref(err)) == 3
    assert err.code == 3 and err.msg == b"an empty REF"
    assert lib.tport_status_name(16) == b"UNAUTHENTICATED"


def test_tensor_info_read_from_its_bytes_field_by_field():
    # _convert reads a tport_tensor_info with one struct.unpack (a batch's
    # results are many): every field, each set to a value of its own, must
    # come out as ctypes reads it
    from tensorport import _convert, _names

    c = _lib.TensorInfoC()
    for i in range(_lib.HANDLE_BYTES):
        c.ref.handle[i] = 0xF0 - i
    c.ref.name = b"n" * (_lib.NAME_MAX - 1)  # the longest name, no room left for junk
    c.dtype, c.ndim = _names.DTYPE_NUMBER["bfloat16"], _lib.MAX_DIMS
    for i in range(_lib.MAX_DIMS):
        c.sizes[i], c.strides[i] = 2 + i, -(1 << 40) - i
    c.storage_offset, c.device = 77, b"sim:1"
    c.actual_format, c.suggested_format = 1, 2
    c.is_contiguous, c.managed, c.conj, c.neg = True, False, True, True
    c.nbytes, c.storage_nbytes, c.expires_unix_ms = 1 << 50, 3, 2**63 - 1
    info, handle = _convert._info_from_c(c)
    assert handle == bytes(c.ref.handle) and info.ref == bytes(c.ref.handle).hex()
    assert info.name == c.ref.name.decode() and info.dtype == "bfloat16"
    assert info.shape == tuple(c.sizes) and info.strides == tuple(c.strides)
    assert (info.storage_offset, info.device) == (77, "sim:1")
    assert (info.memory_format, info.suggested_memory_format) == (_names.FORMATS[1],
                                                                 _names.FORMATS[2])
    assert (info.is_contiguous, info.managed, info.conj, info.neg) == (True, False, True, True)
    assert (info.nbytes, info.storage_nbytes, info.expires_unix_ms) == (1 << 50, 3, 2**63 - 1)
    c.ndim, c.ref.name = 2, b""
    info, _ = _convert._info_from_c(c)
    assert info.shape == (2, 3) and info.name is None
    c.ndim = 99  # out of range: at most MAX_DIMS, never the strides read as sizes
    assert _convert._info_from_c(c)[0].shape == tuple(c.sizes)
