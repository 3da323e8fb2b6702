"""_requests: put, get, info, to and copy issued as libtport asynchronous requests.

Each function issues one request on a client and returns its
:class:`~tensorport._futures._Request`; ``sink(result, exc, cancelled)``
receives the outcome on a library thread (``Client.put_async`` makes it a
concurrent future, ``aio.Client`` hands it to an event loop).  The results
are those of the blocking calls: a :class:`~tensorport.Tensor` for a put
and a ``to``, a NumPy array for a get, a TensorInfo for an info, None for a
copy.
"""
import ctypes

from . import _dlpack, _futures, _lib, _lifetime, _names, _tensor_ops
from ._convert import _info_from_c, _wait_ms
from .errors import InvalidArgument, error_for
from .tensor import Tensor


def put(client, obj, sink, *, name=None, device=None, dtype=None, memory_format=None, ttl=None,
        keep=False, non_blocking=False, managed=False, replace=False):
    """tport_put_dlpack_async of obj, with ``Client.put``'s options (no progress)."""
    ex = _dlpack.export(obj)
    o = client._put_options(ex.is_bool, name=name, device=device, dtype=dtype,
                            memory_format=memory_format, ttl=ttl, non_blocking=non_blocking,
                            managed=managed, replace=replace)
    out = _lib.TensorInfoC()
    if client._lifetime.due():
        client.flush_frees()

    def start(done, arg, req, err):
        h = client._keeping_handle() if keep else client._handle
        return client._lib.tport_put_dlpack_async(h, ex.address, ctypes.byref(o),
                                                  ctypes.byref(out), done, arg, req, err)

    return _futures.issue(client, start, "put" + (" of %r" % name if name else ""),
                          (ex, o, out), lambda: client._tensor(out, made=not keep), sink)


def get(client, ref, sink):
    """A get of ref as a NumPy array.  A Tensor's shape is known: tport_get_async
    into a fresh array.  A name or handle: a one-element
    tport_get_batch_dlpack_async, which looks it up and reads it in the same
    request, into one of the buffers libtport keeps for its gets (as
    Client.get's; the array owns it)."""
    import numpy as np

    r = client._ref(ref)
    what = "get of %r" % (ref.ref if isinstance(ref, Tensor) else ref)
    if isinstance(ref, Tensor):
        a = np.empty(ref.shape, _names.numpy_dtype(ref.dtype))

        def start(done, arg, req, err):
            return client._lib.tport_get_async(client._handle, ctypes.byref(r),
                                               ctypes.c_void_p(a.ctypes.data), a.nbytes, None,
                                               done, arg, req, err)

        def kept(result, exc, cancelled):
            if exc is not None:
                _lifetime.keep_if_written_late(a, exc)  # tportd may still write it
            sink(result, exc, cancelled)

        # ref too: a Tensor collected meanwhile would be freed under the get
        return _futures.issue(client, start, what, (ref, r), lambda: a, kept)
    item = _lib.GetItem()
    item.ref = r
    managed = (ctypes.c_void_p * 1)()

    def start(done, arg, req, err):
        return client._lib.tport_get_batch_dlpack_async(client._handle, ctypes.byref(item), 1,
                                                        managed, done, arg, req, err)

    def finish():
        try:
            info, _ = _info_from_c(item.info)
            dtype = _names.numpy_dtype(info.dtype)
        except BaseException:
            give_back()  # a description this library cannot read
            raise
        ptr, managed[0] = managed[0], None  # the array owns it from here on
        return _dlpack.numpy_from_managed(ptr, dtype)

    def give_back():
        """The buffer of a get no array took, back to libtport."""
        if managed[0]:
            ptr, managed[0] = managed[0], None
            _dlpack.call_deleter(ptr)

    def explain():
        """The element's own error (its message, which the batch's status lacks)."""
        give_back()
        if not item.err.code:
            return None
        return error_for(item.err.code, item.err.msg.decode("utf-8", "replace"))

    return _futures.issue(client, start, what, (item, managed), finish, sink, explain)


def copy(client, dst, src, sink, non_blocking=False):
    """tport_copy_async: dst's values become src's (both Tensors, handles or names)."""
    if not isinstance(src, (Tensor, str)):
        raise InvalidArgument("copy_async's src is a %s: a Tensor, a handle or a name "
                              "(put it first)" % type(src).__name__)
    d, s = client._ref(dst), client._ref(src)

    def start(done, arg, req, err):
        return client._lib.tport_copy_async(client._handle, ctypes.byref(d), ctypes.byref(s),
                                            bool(non_blocking), done, arg, req, err)

    return _futures.issue(client, start, "copy", (dst, src, d, s), lambda: None, sink)


def info(client, ref, sink, wait=None):
    """tport_info_async: ref's TensorInfo, the name waited for up to ``wait`` on the
    server (a Tensor's own info needs no request)."""
    r = client._ref(ref)
    out = _lib.TensorInfoC()
    ms = _wait_ms(wait)

    def start(done, arg, req, err):
        return client._lib.tport_info_async(client._handle, ctypes.byref(r), ms,
                                            ctypes.byref(out), done, arg, req, err)

    return _futures.issue(client, start, "info of %r" % (ref.ref if isinstance(ref, Tensor)
                                                         else ref),
                          (ref, r, out), lambda: _info_from_c(out)[0], sink)


def to(client, t, sink, *to_args):
    """tport_to_async: ``Tensor.to`` (to_args as _tensor_ops.to_options takes them)."""
    if not isinstance(t, Tensor):
        raise InvalidArgument("to_async's tensor is a %s: a Tensor" % type(t).__name__)
    o = _tensor_ops.to_options(*to_args)
    r = client._ref(t)
    out = _lib.TensorInfoC()
    alias = ctypes.c_bool()

    def start(done, arg, req, err):
        return client._lib.tport_to_async(client._handle, ctypes.byref(r), ctypes.byref(o),
                                          ctypes.byref(out), ctypes.byref(alias), done, arg,
                                          req, err)

    return _futures.issue(client, start, "to", (t, o, r, out, alias),
                          lambda: _tensor_ops.result(client, t, out, alias.value), sink)
