"""_tensor_ops: the server-side methods of a :class:`~tensorport.Tensor`.

``to``, ``contiguous``, ``view`` and ``copy_`` as libtport calls on the
Tensor's client.  A result that aliases its source (PyTorch's rule: ``to``
and ``contiguous`` may return ``self``) is the source object itself.
"""
import ctypes

from . import _lib, _names
from ._convert import _enc, _ttl_ms
from .errors import InvalidArgument


def to_options(device, dtype, memory_format, copy, non_blocking, exact_format, name, ttl):
    """The tport_to_options of ``Tensor.to``'s arguments."""
    if dtype is None and _names.looks_like_dtype(device):
        device, dtype = None, device  # to(torch.float16), as PyTorch allows
    o = _lib.ToOptions()
    o.device = _enc(_names.device_name(device))
    if dtype is not None:
        o.has_dtype, o.dtype = True, _names.DTYPE_NUMBER[_names.dtype_name(dtype)]
    if memory_format is not None:
        o.has_memory_format = True
        o.memory_format = _names.FORMAT_NUMBER[_names.format_name(memory_format)]
    o.copy = bool(copy)
    o.non_blocking = bool(non_blocking)
    o.exact_format = bool(exact_format)
    o.name = _enc(name) if name else None
    o.ttl_ms = _ttl_ms(ttl)
    return o


def result(client, src, out, alias):
    """The Tensor of a to/contiguous answer: src itself when it aliases src."""
    t = client._tensor(out, made=not alias)
    return src if alias and t._handle == src._handle else t


def to(client, t, *args):
    o = to_options(*args)
    r = client._ref(t)
    out = _lib.TensorInfoC()
    alias = ctypes.c_bool()
    client._call("tport_to", ctypes.byref(r), ctypes.byref(o), ctypes.byref(out),
                 ctypes.byref(alias))
    return result(client, t, out, alias.value)


def contiguous(client, t, memory_format, name):
    fmt = _names.FORMAT_NUMBER[_names.format_name(memory_format)]
    r = client._ref(t)
    out = _lib.TensorInfoC()
    alias = ctypes.c_bool()
    client._call("tport_contiguous", ctypes.byref(r), fmt, _enc(name) if name else None,
                 ctypes.byref(out), ctypes.byref(alias))
    return result(client, t, out, alias.value)


def view(client, t, shape, strides, storage_offset, name):
    shape = [int(s) for s in shape]
    if strides is None:
        strides, e = [0] * len(shape), 1
        for d in range(len(shape) - 1, -1, -1):
            strides[d] = e
            e *= max(shape[d], 1)
    strides = [int(s) for s in strides]
    if len(strides) != len(shape):
        raise InvalidArgument("view: shape has %d dims and strides %d"
                              % (len(shape), len(strides)))
    n = max(len(shape), 1)
    sz = (ctypes.c_int64 * n)(*shape)
    st = (ctypes.c_int64 * n)(*strides)
    r = client._ref(t)
    out = _lib.TensorInfoC()
    client._call("tport_view", ctypes.byref(r), len(shape), sz, st, int(storage_offset),
                 _enc(name) if name else None, ctypes.byref(out))
    return client._tensor(out, made=True)


def copy(client, dst, src, non_blocking):
    from .tensor import Tensor

    tmp = None
    if not isinstance(src, (Tensor, str)):
        src = tmp = client.put(src)
    try:
        d, s = client._ref(dst), client._ref(src)
        client._call("tport_copy", ctypes.byref(d), ctypes.byref(s), bool(non_blocking))
    finally:
        if tmp is not None:
            client.free(tmp)
