"""_convert: the values Python hands libtport and those it hands back.

Strings to and from C, the durations libtport takes in milliseconds (ttl,
timeout, wait: seconds, timedeltas or "5s"), and a tport_tensor_info as a
:class:`~tensorport.TensorInfo`.
"""
import ctypes
import os
import struct

from . import _lib, _names
from .errors import InvalidArgument
from .tensor import TensorInfo
from .units import _duration_ms


def _s(b):
    return b.decode("utf-8", "replace")


def _env(name):
    v = os.environ.get(name)
    return v if v else None


def _enc(s):
    return None if s is None else os.fsencode(s) if isinstance(s, os.PathLike) else s.encode()


def _ttl_ms(ttl):
    """ttl: seconds, a timedelta, or "10m" as tport --ttl takes it."""
    return 0 if ttl is None else _duration_ms(ttl, "ttl")


def _timeout_ms(timeout):
    """timeout: seconds, a timedelta or "5s"; libtport keeps it in an int."""
    if timeout is None:
        return 0
    ms = _duration_ms(timeout, "timeout")
    if ms > 2**31 - 1:
        raise InvalidArgument("timeout is %r: at most 24 days" % (timeout,))
    return ms


def _wait_ms(wait):
    """A wait in seconds, a timedelta or a string ("5s", as ``tport --wait``
    takes it) as the server's wait_ms (0: none)."""
    if wait is None:
        return 0
    return min(_duration_ms(wait, "wait"), 2**32 - 1)


# tport_tensor_info's bytes, field by field: ref (handle, name), dtype, ndim,
# sizes, strides, storage_offset, device, actual_format, suggested_format,
# is_contiguous, nbytes, storage_nbytes, managed, conj, neg, expires_unix_ms
# (padding as C lays them out; checked against _lib.TensorInfoC below).
_D = _lib.MAX_DIMS
_HEAD = "=%ds%dsii%dq%dq" % (_lib.HANDLE_BYTES, _lib.NAME_MAX, _D, _D)
_INFO = struct.Struct(_HEAD + "q32sii?7xqq???5xq")
_AT = 4 + 2 * _D  # where storage_offset is, and the fields after it
for _field, _before in (("storage_offset", ""), ("is_contiguous", "q32sii"),
                        ("managed", "q32sii?7xqq"), ("expires_unix_ms", "q32sii?7xqq???5x")):
    if struct.calcsize(_HEAD + _before) != getattr(_lib.TensorInfoC, _field).offset:
        raise ImportError("tensorport: _convert reads tport_tensor_info's %s at the wrong place"
                          % _field)
if _INFO.size != ctypes.sizeof(_lib.TensorInfoC):
    raise ImportError("tensorport: _convert's tport_tensor_info is not _lib's size")


def _cstr(b):
    return _s(b.split(b"\0", 1)[0])


def _info_from_bytes(raw):
    """The TensorInfo of a tport_tensor_info's bytes (bytes(TensorInfoC))."""
    v = _INFO.unpack_from(raw)
    nd = min(max(v[3], 0), _D)
    return TensorInfo(
        ref=v[0].hex(),
        name=_cstr(v[1]) or None,
        dtype=_names.dtype_of_number(v[2]),
        shape=v[4:4 + nd],
        strides=v[4 + _D:4 + _D + nd],
        storage_offset=v[_AT],
        device=_cstr(v[_AT + 1]),
        memory_format=_names.FORMATS[v[_AT + 2]],
        suggested_memory_format=_names.FORMATS[v[_AT + 3]],
        is_contiguous=v[_AT + 4],
        nbytes=v[_AT + 5],
        storage_nbytes=v[_AT + 6],
        managed=v[_AT + 7],
        conj=v[_AT + 8],
        neg=v[_AT + 9],
        expires_unix_ms=v[_AT + 10],
    )


def _info_from_c(c):
    """(TensorInfo, handle bytes) of a TensorInfoC."""
    raw = bytes(c)
    return _info_from_bytes(raw), raw[:_lib.HANDLE_BYTES]


def _handle_and_name_of(raw):
    """(handle bytes, name or None) of a tport_tensor_info's bytes, without the rest."""
    h = _lib.HANDLE_BYTES
    return raw[:h], _cstr(raw[h:h + _lib.NAME_MAX]) or None
