"""_batch: state dicts over tport_put_batch and tport_get_batch_dlpack.

``put_dict`` describes every value (a host torch.Tensor or NumPy array, made
C-contiguous) as a tport_put_item named ``prefix + key``; ``get_dict`` lists
the tenant's names under a prefix and reads them all in one
tport_get_batch_dlpack, into buffers libtport keeps for its gets: the
values of 1 MiB or more, once collected, give their memory to the next
get_dict's (within TPORT_GET_CACHE_BYTES), where fresh memory would fault
in a page at a time (malloc maps every block over 32 MiB anew).  libtport
sends the small ones together and up to four larger ones a request (lent,
not copied), and the largest in chunks, all through one window of the
client's requests.

Errors are per element.  A put_dict is all or nothing: when an element
fails, the elements that were put are freed again (with ``replace``, the
names they replaced are then empty) and one :class:`BatchError` names every
failed key.  A get_dict raises the same for the keys it could not read.
"""
import ctypes
import sys

from . import _dlpack, _lib, _names
from .errors import Error, InvalidArgument, error_for


class BatchError(Error):
    """Some elements of a batch failed: ``.errors`` is ``{key: Error}`` (every failed
    key); ``.code``/``.status`` are the first failure's."""

    def __init__(self, what, errors):
        first = next(iter(errors.values()))
        super().__init__("%s: %d of the elements failed: %s" % (
            what, len(errors), "; ".join("%s: %s" % (k, e) for k, e in errors.items())),
            first.code)
        self.errors = errors

    def __reduce__(self):
        return (BatchError, ("batch", self.errors))


class _PutItemAddresses(ctypes.Structure):
    """tport_put_item with its pointers as plain addresses: an int is set ~5x faster
    than a ctypes pointer made for it (161 of them a state dict)."""

    _fields_ = [(f, ctypes.c_void_p if f in ("sizes", "strides", "opts") else t)
                for f, t in _lib.PutItem._fields_]


if any(getattr(_PutItemAddresses, f).offset != getattr(_lib.PutItem, f).offset
       for f, _ in _lib.PutItem._fields_) or \
        ctypes.sizeof(_PutItemAddresses) != ctypes.sizeof(_lib.PutItem):
    raise ImportError("tensorport: _batch's tport_put_item is not _lib's")


def _host_values(key, v):
    """(dtype name, shape, address, nbytes, keepalive) of a state dict value."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(v, torch.Tensor):
        if v.device.type != "cpu":
            raise InvalidArgument("%s is on %s: put_dict takes host tensors (give "
                                  "t.cpu(), or put it alone with put())" % (key, v.device))
        t = v.detach().resolve_conj().resolve_neg().contiguous()
        name = str(t.dtype)[6:]
        if name not in _names.DTYPE_NUMBER:
            raise InvalidArgument("%s is %s: tensorport has %s"
                                  % (key, t.dtype, ", ".join(_names.DTYPES)))
        return name, tuple(t.shape), t.data_ptr(), t.numel() * t.element_size(), t
    import numpy as np

    a = np.asarray(v)
    if not a.flags.c_contiguous:  # (not ascontiguousarray alone: it makes a 0-d value 1-d)
        a = np.ascontiguousarray(a)
    if not a.dtype.isnative:
        a = a.astype(a.dtype.newbyteorder("="))
    name = _names.numpy_to_name(a.dtype)
    if name is None:
        raise InvalidArgument("%s is %s: tensorport has %s"
                              % (key, a.dtype, ", ".join(_names.DTYPES)))
    return name, a.shape, a.ctypes.data, a.nbytes, a


def _failures(items, keys):
    return {k: error_for(it.err.code, it.err.msg.decode("utf-8", "replace"))
            for k, it in zip(keys, items) if it.err.code}


def put_dict(client, d, prefix, *, device=None, dtype=None, ttl=None, replace=False):
    """Client.put_dict (see there)."""
    if not isinstance(prefix, str):
        raise InvalidArgument("prefix is a %s: a str" % type(prefix).__name__)
    keys = list(d)
    if not keys:
        return {}
    for k in keys:
        if not isinstance(k, str):
            raise InvalidArgument("state dict key %r is not a str" % (k,))
    n = len(keys)
    values = [_host_values(k, d[k]) for k in keys]
    # what the elements share is made once: the options (each element's a copy
    # with its own name) and one array of every element's sizes
    shared = client._put_options(False, device=device, dtype=dtype, ttl=ttl, replace=replace)
    opts = (_lib.PutOptions * n)()
    names = [(prefix + k).encode() for k in keys]
    dims = (ctypes.c_int64 * max(sum(len(v[1]) for v in values), 1))(
        *[s for v in values for s in v[1]])
    items = (_PutItemAddresses * n)()
    at, opts_at, opts_size = ctypes.addressof(dims), ctypes.addressof(opts), ctypes.sizeof(opts[0])
    number = _names.DTYPE_NUMBER
    for i in range(n):
        name, shape, address, nbytes, _ = values[i]
        opts[i] = shared
        opts[i].name = names[i] or None  # ("": unnamed, as put's name="")
        it = items[i]
        it.dtype = number[name]
        it.ndim = len(shape)
        it.sizes = at
        it.data = address
        it.nbytes = nbytes
        it.opts = opts_at + i * opts_size
        at += 8 * len(shape)
    # (values, shared, opts, names and dims live until here: the items point into them)
    rc, err = _run(client, "tport_put_batch", ctypes.cast(items, ctypes.POINTER(_lib.PutItem)), n)
    failed = _failures(items, keys)
    if not failed:
        client._check(rc, err)  # a failure of the batch as a whole
        return {k: client._tensor(items[i].info) for i, k in enumerate(keys)}
    done = [i for i, it in enumerate(items) if not it.err.code]
    if done:
        refs = (_lib.Ref * len(done))()
        for j, i in enumerate(done):
            ctypes.memmove(refs[j].handle, items[i].info.ref.handle, _lib.HANDLE_BYTES)
        # all or nothing; a failure to free is not reported: the batch's is
        _run(client, "tport_free_many", refs, len(done), ctypes.byref(ctypes.c_size_t()))
    raise BatchError("put_dict", failed)


def _run(client, fn, *args):
    """fn(handle, *args, &err) in the client's guard: (status, err) without raising
    (the per-element errors tell more than the batch's status)."""
    err = _lib.Err()
    client._enter()
    try:
        rc = getattr(client._lib, fn)(client._handle, *args, ctypes.byref(err))
    finally:
        client._exit()
    return rc, err


def get_dict(client, prefix, *, as_torch=False):
    """Client.get_dict (see there)."""
    if not isinstance(prefix, str):
        raise InvalidArgument("prefix is a %s: a str" % type(prefix).__name__)
    found = client._named(prefix)
    if not found:
        return {}
    if as_torch:
        import torch.utils.dlpack  # noqa: F401 (here: a missing torch fails before any get)
    n = len(found)
    items = (_lib.GetItem * n)()
    managed = (ctypes.c_void_p * n)()
    for i, (_, handle, _) in enumerate(found):
        # by handle: what the listing saw, even if a name is replaced meanwhile
        ctypes.memmove(items[i].ref.handle, handle, _lib.HANDLE_BYTES)
    keys = [name[len(prefix):] for name, _, _ in found]
    rc, err = _run(client, "tport_get_batch_dlpack", items, n, managed)
    outs = []
    try:
        failed = _failures(items, keys)
        if failed:
            raise BatchError("get_dict", failed)
        client._check(rc, err)
        dtypes = {}  # the NumPy dtype of each dtype number the dict holds
        for i, (_, _, number) in enumerate(found):
            ptr, managed[i] = managed[i], None  # the value owns it from here on (its
            # maker gives it back if it cannot make it)
            name = _names.dtype_of_number(number)
            if as_torch:
                outs.append(_dlpack.torch_from_managed(ptr, name))
                continue
            dtype = dtypes.get(number)
            if dtype is None:
                dtype = dtypes[number] = _names.numpy_dtype(name)
            outs.append(_dlpack.numpy_from_managed(ptr, dtype))
    finally:
        for ptr in managed:
            if ptr:  # not handed to an array: the batch failed, or a conversion did
                _dlpack.call_deleter(ptr)
    return dict(zip(keys, outs))
