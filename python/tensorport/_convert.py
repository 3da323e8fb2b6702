"""_convert: the values Python hands libtport and those it hands back.

Strings to and from C, the durations libtport takes in milliseconds (ttl,
timeout, wait: seconds, timedeltas or "5s"), and a tport_tensor_info as a
:class:`~tensorport.TensorInfo`.
"""
import os

from . import _names
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


def _info_from_c(c):
    h = bytes(c.ref.handle)
    return (
        TensorInfo(
            ref=h.hex(),
            name=_s(c.ref.name) or None,
            dtype=_names.dtype_of_number(c.dtype),
            shape=tuple(c.sizes[: c.ndim]),
            strides=tuple(c.strides[: c.ndim]),
            storage_offset=c.storage_offset,
            device=_s(c.device),
            memory_format=_names.FORMATS[c.actual_format],
            suggested_memory_format=_names.FORMATS[c.suggested_format],
            is_contiguous=bool(c.is_contiguous),
            nbytes=c.nbytes,
            storage_nbytes=c.storage_nbytes,
            managed=bool(c.managed),
            conj=bool(c.conj),
            neg=bool(c.neg),
            expires_unix_ms=c.expires_unix_ms,
        ),
        h,
    )
