"""client: a connection to a tportd, over libtport.

A :class:`Client` wraps one ``tport_client``.  Calls go straight to libtport
through ctypes, which releases the GIL for the length of each call (so
transfers overlap other Python threads) and takes it back for progress
callbacks.  libtport lets many threads share a client; the one rule it sets,
that ``tport_close`` must not race with calls, is kept here: ``close()``
waits for the calls in flight, and calls after it raise FailedPrecondition.
"""
import ctypes
import functools
import os
import sys
import threading
import weakref

from . import _batch, _dlpack, _futures, _lib, _lifetime, _names, _requests
from ._convert import (_enc, _env, _handle_and_name_of, _info_from_bytes, _info_from_c, _s,
                       _timeout_ms, _ttl_ms, _wait_ms)
from ._devices import DeviceInfo, DeviceList, devices_from_c
from ._progress import Progress
from .errors import Error, FailedPrecondition, InvalidArgument, NotFound, error_for
from .tensor import Tensor

__all__ = ["Client", "DeviceInfo", "DeviceList", "DEFAULT_URL"]

#: where a Client connects without url= or $TPORT_URL (tportd's default listener)
DEFAULT_URL = "tcp://127.0.0.1:7450"

_libc_free = ctypes.CDLL(None).free
_libc_free.argtypes = [ctypes.c_void_p]
_libc_free.restype = None


# A get by name looks the name up, then reads that tensor by its handle: a
# replace in between (put(replace=True)) takes the handle away, and the get
# begins again with what the name holds then, up to this many times.
_GET_TRIES = 20


def _close_handles(lib, handles):
    for h in handles:
        lib.tport_close(h)
    handles.clear()


class Client:
    """A connection to a tportd.

    ``url`` (default ``$TPORT_URL``, else ``tcp://127.0.0.1:7450``; also
    ``ipc:///path``, ``tls+tcp://host:port``), ``tenant`` (``$TPORT_TENANT``,
    else "default"), ``secret_file`` (``$TPORT_SECRET_FILE``: the tenant's hex
    secret, mode 600, for a server with ``--auth-file``; or ``secret=`` in
    hex; a server without one asks for its user's local secret, which
    libtport reads by itself on a local URL: ``$TPORT_LOCAL_SECRET``), ``tls_ca``/``tls_cert``/``tls_key``/``tls_server_name``
    (``$TPORT_TLS_CA``, ...), ``verify`` (``$TPORT_VERIFY=1``: a CRC32C on
    every chunk), ``timeout`` (per request: seconds, a timedelta or a string
    such as "5s" or "2m", parsed as tport's flags are; default 60 s), ``keep``
    (keep everything this client makes for the tenant, as the ``tport`` tool
    does; default False: unnamed tensors go when the client closes), ``shm``
    (same host: on a local URL -- ``ipc://``, ``tcp://127.0.0.1`` -- to a
    server that offers shared memory, large tensors go through a sealed
    memfd region at memory speed instead of the socket -- and over ``ipc://``
    the server reads a large put's bytes straight from the array, unless
    ``$TPORT_SHM_DIRECT=0``; default True unless ``$TPORT_SHM=0``).

    A context manager: ``with tensorport.Client() as c: ...`` closes it.
    Many threads may share one client.  Raises Unavailable when the server
    cannot be reached, Unauthenticated when it refuses the tenant's proof.
    """

    def __init__(self, url=None, tenant=None, secret_file=None, tls_ca=None, *, secret=None,
                 tls_cert=None, tls_key=None, tls_server_name=None, verify=None, timeout=None,
                 keep=False, shm=None):
        self._lib = lib = _lib.load()
        self.url = url or _env("TPORT_URL") or DEFAULT_URL
        self.tenant = tenant or _env("TPORT_TENANT") or "default"
        if verify is None:
            verify = os.environ.get("TPORT_VERIFY") == "1"
        self._conf = {
            "tenant": self.tenant,
            "secret": secret,
            "secret_file": secret_file or _env("TPORT_SECRET_FILE"),
            "tls_ca": tls_ca or _env("TPORT_TLS_CA"),
            "tls_cert": tls_cert or _env("TPORT_TLS_CERT"),
            "tls_key": tls_key or _env("TPORT_TLS_KEY"),
            "tls_server_name": tls_server_name or _env("TPORT_TLS_SERVER_NAME"),
            "verify": bool(verify),
            "timeout_ms": _timeout_ms(timeout),
            "no_shm": shm is not None and not shm,
        }
        self.keep = bool(keep)
        self._cv = threading.Condition()
        self._active = 0
        self._closed = False
        self._local = threading.local()
        self._handles = []  # main connection first; a keeping one (put(keep=True)) may follow
        self._keeper = None
        self._lifetime = _lifetime.Lifetime()  # what this client made: freed when dropped
        self._handle = self._connect(self.keep)
        self._handles.append(self._handle)
        self._finalizer = weakref.finalize(self, _close_handles, lib, self._handles)

    def _connect(self, keep):
        o = _lib.ConnectOptions()
        c = self._conf
        o.tenant = _enc(c["tenant"])
        o.timeout_ms = c["timeout_ms"]
        o.keep = keep
        o.secret = _enc(c["secret"])
        for k in ("secret_file", "tls_ca", "tls_cert", "tls_key", "tls_server_name"):
            setattr(o, k, _enc(c[k]))
        o.verify = c["verify"]
        o.no_shm = c["no_shm"]
        h = ctypes.c_void_p()
        err = _lib.Err()
        rc = self._lib.tport_connect(self.url.encode(), ctypes.byref(o), ctypes.byref(h),
                                     ctypes.byref(err))
        self._check(rc, err)
        return h.value

    @staticmethod
    def _check(rc, err):
        if rc:
            raise error_for(rc, _s(err.msg))

    # ------------------------------------------------------------ lifetime

    def _enter(self):
        with self._cv:
            if self._closed:
                raise FailedPrecondition("the client is closed")
            self._active += 1
        self._local.depth = getattr(self._local, "depth", 0) + 1

    def _exit(self):
        self._local.depth -= 1
        with self._cv:
            self._active -= 1
            if self._active == 0:
                self._cv.notify_all()

    def _call(self, fn, *args):
        """libtport's ``fn(handle, *args, &err)`` inside the client's lifetime
        guard; a failure raises the error class of its code."""
        if self._lifetime.due():
            self.flush_frees()
        err = _lib.Err()
        self._enter()
        try:
            rc = getattr(self._lib, fn)(self._handle, *args, ctypes.byref(err))
        finally:
            self._exit()
        self._check(rc, err)

    def flush_frees(self):
        """Frees on the server, in one request, the tensors this client made whose
        Tensor objects Python has garbage-collected since (see ``put``); returns how
        many were freed.  The client does this by itself before a request once 64
        are queued, and before ``list()`` and ``stats()``."""
        handles = self._lifetime.take()
        if not handles:
            return 0
        refs = (_lib.Ref * len(handles))()
        for i, h in enumerate(handles):
            ctypes.memmove(refs[i].handle, h, _lib.HANDLE_BYTES)
        freed = ctypes.c_size_t()
        err = _lib.Err()
        self._enter()
        try:
            rc = self._lib.tport_free_many(self._handle, refs, len(handles), ctypes.byref(freed),
                                           ctypes.byref(err))
        finally:
            self._exit()
        self._check(rc, err)
        return freed.value

    def _keeping_handle(self):
        """The connection that keeps what it makes (the main one when keep=True)."""
        if self.keep:
            return self._handle
        with self._cv:
            if self._keeper is None:
                self._keeper = self._connect(True)
                self._handles.append(self._keeper)
            return self._keeper

    @property
    def closed(self):
        """True once ``close()`` has run."""
        return self._closed

    def close(self):
        """Closes the connection, after the calls in flight on other threads end.

        Unnamed tensors this client made go with it (unless it was made with
        ``keep=True``, or they were put with ``keep=True``); named ones stay.
        Calling it again does nothing.
        """
        if getattr(self._local, "depth", 0):
            raise FailedPrecondition("close() from inside a call on the same client "
                                     "(a progress callback?)")
        if _futures.in_callback():
            raise FailedPrecondition("close() inside a future's done-callback: it runs on a "
                                     "libtport thread, which closing must wait for")
        with self._cv:
            if self._closed:
                return
            self._closed = True
            while self._active:
                self._cv.wait()
        self._finalizer()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        """Leaving a ``with`` block closes the client."""
        self.close()
        return False

    def __repr__(self):
        return "tensorport.Client(url=%r, tenant=%r%s)" % (
            self.url, self.tenant, ", closed" if self._closed else "")

    # ------------------------------------------------------------ refs

    def _ref(self, ref):
        """A tport_ref for a Tensor (its handle) or a str (32 hex digits: a handle; else a name)."""
        r = _lib.Ref()
        if isinstance(ref, Tensor):
            ctypes.memmove(r.handle, ref._handle, _lib.HANDLE_BYTES)
            return r
        if not isinstance(ref, str):
            raise InvalidArgument("ref is a %s: a Tensor, a handle (32 hex digits) or a name"
                                  % type(ref).__name__)
        err = _lib.Err()
        self._check(self._lib.tport_ref_parse(ref.encode(), ctypes.byref(r), ctypes.byref(err)),
                    err)
        return r

    def _tensor(self, c, made=False):
        """The Tensor of c: one this call made (made) on the client's own connection
        without a name is freed when Python drops it; one it made before is the
        same object again."""
        raw = bytes(c)
        handle, name = _handle_and_name_of(raw)
        info = functools.partial(_info_from_bytes, raw)  # decoded when first read
        if made and name is None and not self.keep:
            return self._lifetime.adopt(Tensor(self, info, handle))
        return self._lifetime.existing(handle) or Tensor(self, info, handle)

    def _info_c(self, ref, wait=None):
        r = self._ref(ref)
        out = _lib.TensorInfoC()
        ms = _wait_ms(wait)
        if ms:
            self._call("tport_info_wait", ctypes.byref(r), ms, ctypes.byref(out))
        else:
            self._call("tport_info", ctypes.byref(r), ctypes.byref(out))
        return out

    def _info_of(self, ref, wait=None):
        return _info_from_c(self._info_c(ref, wait))[0]

    def info(self, ref, *, wait=None):
        """The :class:`TensorInfo` of a tensor (a Tensor, a handle or a name).

        ``wait`` (seconds): a name that no tensor holds yet is waited for -- on
        the server, which answers as soon as a put (or a replace) publishes it,
        without polling -- and DeadlineExceeded is raised after ``wait`` seconds
        (at most the server's ``--deadline``, 30 s by default).  A name that
        exists answers at once.
        """
        if isinstance(ref, Tensor):
            return ref._info
        return self._info_of(ref, wait)

    def _resolve(self, ref, wait=None):
        """(tport_ref by handle, TensorInfo): a Tensor needs no round trip (a handle's
        dtype and shape never change); a name is looked up once (waited for up to
        ``wait`` seconds)."""
        if isinstance(ref, Tensor):
            return self._ref(ref), ref._info
        info = self._info_of(ref, wait)
        r = _lib.Ref()
        ctypes.memmove(r.handle, bytes.fromhex(info.ref), _lib.HANDLE_BYTES)
        return r, info

    # ------------------------------------------------------------ put and get

    def put(self, obj, *, name=None, device=None, dtype=None, memory_format=None, ttl=None,
            keep=False, non_blocking=False, managed=False, progress=None, replace=False):
        """Uploads a host tensor; returns the :class:`Tensor` the server made.

        ``obj``: a NumPy array, a CPU or CUDA torch.Tensor (any strides,
        storage offset, conj/neg bits, bfloat16, complex), anything with
        ``__dlpack__`` in host or CUDA memory, or anything ``numpy.asarray``
        takes.  GPU memory goes to a server on this host by CUDA IPC (the
        server copies device to device), to another host staged through the
        client's pinned chunks
        (tport_put_dlpack; the CUDA runtime is loaded on first use, from
        ``$TPORT_CUDART_LIBRARY`` or libcudart.so.13/.12).
        A dense layout travels as it is and is kept (``memory_format``
        "preserve"); other layouts arrive in C order.  NumPy uint16 arrays are
        bfloat16 bit patterns (tensorport has no uint16).

        ``name`` (and ``ttl``: seconds, a timedelta or "10m") keeps it for the tenant under that
        name; ``keep=True`` keeps it without a name.  With ``replace=True`` a
        tensor already of that name is replaced once this one is complete, in one
        step: a reader by name gets the old tensor or the new one, never a part
        (publishing "the latest weights"); without it an existing name raises
        AlreadyExists.  An unnamed tensor without ``keep`` lives as long as the
        returned Tensor object: once Python collects it, the client frees it on
        the server (batched, see ``flush_frees``), as Ray frees an object when
        its last reference goes.  ``device`` (default
        cpu), ``dtype`` and ``memory_format`` convert it on the server;
        ``managed`` allocates unified memory on a GPU; ``non_blocking``
        returns before the device copies end (later calls on it wait for
        them).  ``progress``: a callable(done_bytes, total_bytes), or True for
        a tqdm bar.
        """
        ex = _dlpack.export(obj)
        o = self._put_options(ex.is_bool, name=name, device=device, dtype=dtype,
                              memory_format=memory_format, ttl=ttl, non_blocking=non_blocking,
                              managed=managed, replace=replace)
        prog = Progress(progress, "put")
        o.progress = prog.cfunc
        out = _lib.TensorInfoC()
        err = _lib.Err()
        rc = -1
        if self._lifetime.due():
            self.flush_frees()
        self._enter()
        try:
            h = self._keeping_handle() if keep else self._handle
            rc = self._lib.tport_put_dlpack(h, ex.address, ctypes.byref(o), ctypes.byref(out),
                                            ctypes.byref(err))
        finally:
            self._exit()
            del ex
            if rc:
                prog.close()
        self._check(rc, err)
        t = self._tensor(out, made=not keep)
        try:
            prog.finish()
        except BaseException:
            try:
                t.free()
            except Exception:
                pass
            raise
        return t

    def _put_options(self, is_bool, *, name=None, device=None, dtype=None, memory_format=None,
                     ttl=None, non_blocking=False, managed=False, replace=False):
        """The tport_put_options of put's arguments (is_bool: bool values sent as uint8)."""
        o = _lib.PutOptions()
        self._lib.tport_put_options_init(ctypes.byref(o))
        o.name = _enc(name) if name else None
        o.ttl_ms = _ttl_ms(ttl)
        o.replace = bool(replace)
        o.device = _enc(_names.device_name(device))
        if dtype is not None:
            o.has_dtype, o.dtype = True, _names.DTYPE_NUMBER[_names.dtype_name(dtype)]
        elif is_bool:
            o.has_dtype, o.dtype = True, _names.DTYPE_NUMBER["bool"]
        if memory_format is not None:
            o.memory_format = _names.FORMAT_NUMBER[_names.format_name(memory_format)]
        o.managed = bool(managed)
        o.non_blocking = bool(non_blocking)
        return o

    def _get_managed(self, r):
        """tport_get_dlpack: the address of a DLManagedTensor this caller now owns."""
        p = ctypes.c_void_p()
        self._call("tport_get_dlpack", ctypes.byref(r), ctypes.byref(p))
        return p.value

    def _get_into(self, r, address, nbytes, prog):
        err = _lib.Err()
        rc = -1
        self._enter()
        try:
            rc = self._lib.tport_get(self._handle, ctypes.byref(r), ctypes.c_void_p(address),
                                     nbytes, None, prog.cfunc, None, ctypes.byref(err))
        finally:
            self._exit()
            if rc:
                prog.close()
        self._check(rc, err)
        prog.finish()

    def get(self, ref, *, progress=None, out=None, wait=None):
        """Downloads a tensor (a Tensor, a handle or a name) as a NumPy array.

        The values in logical C order, writable, in the tensor's dtype;
        bfloat16 as ``ml_dtypes.bfloat16`` when that package is present, else
        as uint16 bit patterns (the ``.npy`` convention of the ``tport``
        tool).  ``progress`` as in ``put``.

        ``out``: a NumPy array (C-contiguous, writable, of the tensor's shape
        and of the dtype ``get`` would return), a torch.Tensor or anything
        ``get_into`` takes; the values are written into it (checked before a
        byte is written) and ``out`` is returned.

        ``wait`` (seconds), with a name: wait for it as ``info(name, wait=)``
        does.  A get by name reads the tensor the name holds when it begins; a
        replace meanwhile (``put(replace=True)``) never mixes the two.
        """
        for tries in range(_GET_TRIES):
            try:
                return self._get(ref, progress, out, wait)
            except NotFound:
                # by name: the tensor found was replaced before its bytes were
                # read (its handle went); the name holds the next one
                if isinstance(ref, Tensor) or tries == _GET_TRIES - 1 or not self._replaced(ref):
                    raise

    def _replaced(self, name):
        """True when name (not a handle) names a tensor now."""
        if len(name) == 2 * _lib.HANDLE_BYTES and all(ch in "0123456789abcdefABCDEF"
                                                       for ch in name):
            return False
        try:
            self._info_of(name)
            return True
        except NotFound:
            return False

    def _get(self, ref, progress, out, wait):
        import numpy as np

        r, info = self._resolve(ref, wait)
        dtype = _names.numpy_dtype(info.dtype)
        if out is not None:
            if not isinstance(out, np.ndarray):
                if progress:
                    raise InvalidArgument("progress is for gets into NumPy arrays or new arrays")
                return self._get_into_dlpack(r, out)
            if out.shape != tuple(info.shape) or out.dtype != dtype:
                raise InvalidArgument("out is %s of shape %s: the tensor is %s of shape %s"
                                      % (out.dtype, out.shape, dtype, tuple(info.shape)))
            if not out.flags.c_contiguous or not out.flags.writeable:
                raise InvalidArgument("out must be C-contiguous and writable: a get writes "
                                      "its values in logical C order")
            self._get_into(r, out.ctypes.data, out.nbytes, Progress(progress, "get"))
            return out
        if progress is None or progress is False:
            return _dlpack.numpy_from_managed(self._get_managed(r), dtype)
        prog = Progress(progress, "get")
        a = np.empty(info.shape, dtype)
        try:
            self._get_into(r, a.ctypes.data, a.nbytes, prog)
        except Error as e:
            _lifetime.keep_if_written_late(a, e)
            raise
        return a

    def get_into(self, ref, out):
        """Downloads a tensor into ``out`` and returns it: a torch.Tensor (CPU or CUDA)
        or an object with ``__dlpack__`` (host or CUDA memory), contiguous, of the
        tensor's shape and dtype (checked before a byte is written; bool goes into
        bool or uint8).  CUDA memory on the server's host is written by the server
        itself, device to device (CUDA IPC); from another host it is staged through
        libtport's pinned chunks.  The bytes are in ``out`` when it returns.
        """
        r, _ = self._resolve(ref)
        return self._get_into_dlpack(r, out)

    def _get_into_dlpack(self, r, out):
        ex = _dlpack.export_out(out)
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(out, torch.Tensor) and out.device.type == "cuda":
            # what is queued on out's stream ends before the server writes it
            torch.cuda.current_stream(out.device).synchronize()
        err = _lib.Err()
        rc = -1
        self._enter()
        try:
            rc = self._lib.tport_get_into_dlpack(self._handle, ctypes.byref(r),
                                                 ctypes.c_void_p(ex.address), None,
                                                 ctypes.byref(err))
        finally:
            self._exit()
        del ex
        self._check(rc, err)
        return out

    def get_torch(self, ref, *, progress=None, device=None):
        """Downloads a tensor as a torch.Tensor (contiguous, its exact dtype: bfloat16,
        complex and bool included), through DLPack: on the CPU, or with ``device``
        (``"cuda:0"``, a torch.device) into a fresh tensor there (see ``get_into``).
        ``progress`` as in ``put`` (CPU only)."""
        import torch

        r, info = self._resolve(ref)
        if device is not None and torch.device(device).type != "cpu":
            if progress:
                raise InvalidArgument("progress is for gets into host memory")
            out = torch.empty(info.shape, dtype=_names.torch_dtype(info.dtype), device=device)
            return self._get_into_dlpack(r, out)
        if progress is None or progress is False:
            return _dlpack.torch_from_managed(self._get_managed(r), info.dtype)
        prog = Progress(progress, "get")
        t = torch.empty(info.shape, dtype=_names.torch_dtype(info.dtype))
        try:
            self._get_into(r, t.data_ptr(), t.numel() * t.element_size(), prog)
        except Error as e:
            _lifetime.keep_if_written_late(t, e)
            raise
        return t

    def _get_capsule(self, ref):
        r, _ = self._resolve(ref)
        return _dlpack.capsule_from_managed(self._get_managed(r))

    # ------------------------------------------------------------ futures and batches

    def _future(self, issue):
        fut = _futures.TransferFuture()
        fut._request = issue(_futures.future_sink(fut))
        return fut

    def put_async(self, obj, *, name=None, device=None, dtype=None, memory_format=None,
                  ttl=None, keep=False, non_blocking=False, managed=False, replace=False):
        """``put`` as a request that runs on libtport's threads: returns at once with a
        :class:`concurrent.futures.Future` (a ``TransferFuture``) whose result is the
        :class:`Tensor`.  Many requests in flight share the client's connection.
        ``obj`` must not change until the future is done.  Arguments as ``put``'s
        (no ``progress``).  ``future.cancel()`` stops it between chunks (nothing of
        it stays on the server); see ``TransferFuture``."""
        return self._future(lambda sink: _requests.put(
            self, obj, sink, name=name, device=device, dtype=dtype, memory_format=memory_format,
            ttl=ttl, keep=keep, non_blocking=non_blocking, managed=managed, replace=replace))

    def get_async(self, ref):
        """``get`` as a request: a Future whose result is the NumPy array.  A Tensor is
        read into a fresh array; a name or handle is looked up and read in one request."""
        return self._future(lambda sink: _requests.get(self, ref, sink))

    def info_async(self, ref, *, wait=None):
        """``info`` as a request: a Future of the :class:`TensorInfo`.  With ``wait``
        the name is waited for on the server (as ``info(name, wait=)``), holding no
        Python thread: one of libtport's while it waits."""
        return self._future(lambda sink: _requests.info(self, ref, sink, wait))

    def to_async(self, t, device=None, dtype=None, memory_format=None, copy=False,
                 non_blocking=False, exact_format=False, name=None, ttl=None):
        """``t.to(...)`` (``Tensor.to``'s arguments) as a request: a Future of the
        resulting :class:`Tensor` (``t`` itself where PyTorch would alias)."""
        return self._future(lambda sink: _requests.to(
            self, t, sink, device, dtype, memory_format, copy, non_blocking, exact_format,
            name, ttl))

    def copy_async(self, dst, src, *, non_blocking=False):
        """``dst.copy_(src)`` as a request (both Tensors, handles or names): a Future of None."""
        return self._future(lambda sink: _requests.copy(self, dst, src, sink, non_blocking))

    def put_dict(self, d, prefix="", *, device=None, dtype=None, ttl=None, replace=False):
        """Puts a state dict -- ``{key: torch.Tensor or numpy array}`` -- as tensors named
        ``prefix + key``, in one batch (tport_put_batch: small tensors share round
        trips); returns ``{key: Tensor}``.  ``device``, ``dtype``, ``ttl`` and
        ``replace`` as ``put``'s, for every tensor.  Host tensors only (a CUDA one
        raises, naming ``.cpu()``).  When any element fails, the ones that were put
        are freed and a :class:`BatchError` names every failed key with its error."""
        return _batch.put_dict(self, d, prefix, device=device, dtype=dtype, ttl=ttl,
                               replace=replace)

    def get_dict(self, prefix="", *, as_torch=False):
        """The tenant's tensors named ``prefix...``, fetched in one batch
        (tport_get_batch_dlpack, into the buffers libtport keeps for its gets):
        ``{name without prefix: numpy array}`` (torch tensors with ``as_torch=True``).
        A :class:`BatchError` names every key that failed."""
        return _batch.get_dict(self, prefix, as_torch=as_torch)

    # ------------------------------------------------------------ tensors

    def tensor(self, ref):
        """The :class:`Tensor` for a handle (32 hex digits) or a name; NotFound if there is none."""
        return self._tensor(self._info_c(ref))

    def _listed(self, take, prefix=None):
        """take(info) of each tport_tensor_info of tport_list (this tenant's tensors;
        with prefix, tport_list_named's: the named ones under it, by name), None
        results left out."""
        self.flush_frees()
        p = ctypes.POINTER(_lib.TensorInfoC)()
        n = ctypes.c_size_t()
        if prefix is None:
            self._call("tport_list", ctypes.byref(p), ctypes.byref(n))
        else:
            if not isinstance(prefix, str) or "\0" in prefix:
                raise InvalidArgument("prefix is %r: a str without NUL" % (prefix,))
            self._call("tport_list_named", _enc(prefix), ctypes.byref(p), ctypes.byref(n))
        try:
            return [x for x in (take(p[i]) for i in range(n.value)) if x is not None]
        finally:
            _libc_free(ctypes.cast(p, ctypes.c_void_p))

    def list(self, prefix=None):
        """This tenant's tensors (those of each of its connections, and those kept or named),
        as Tensors.
        With ``prefix`` (a str), only the named ones whose names begin with it, sorted
        by name (``""``: every named one); the server picks them out."""
        return self._listed(self._tensor, prefix)

    def _named(self, prefix):
        """(name, handle, dtype number) of this tenant's tensors named ``prefix...``,
        sorted by name: the server's listing under the prefix, without a Tensor for
        each (get_dict's; ~20 us a tensor as Tensors)."""

        def named(c):
            return (_s(c.ref.name), bytes(c.ref.handle), c.dtype)

        return self._listed(named, prefix)

    def free(self, ref):
        """Frees a tensor (a Tensor, a handle or a name) on the server."""
        r = self._ref(ref)
        self._call("tport_free", ctypes.byref(r))
        mine = ref if isinstance(ref, Tensor) else self._lifetime.existing(bytes(r.handle))
        if mine is not None:
            self._lifetime.forget(mine)

    def sync(self, ref=None):
        """Waits for a tensor's pending device work (a non_blocking put or to), or for all
        of this connection's work when ``ref`` is None."""
        r = None if ref is None else ctypes.byref(self._ref(ref))
        self._call("tport_sync", r)

    def devices(self):
        """The server's devices: a :class:`DeviceList` of :class:`DeviceInfo`."""
        p = ctypes.POINTER(_lib.DeviceInfoC)()
        n = ctypes.c_size_t()
        why = ctypes.create_string_buffer(256)
        self._call("tport_devices", ctypes.byref(p), ctypes.byref(n), why, len(why))
        try:
            return devices_from_c(p, n.value, why.value)
        finally:
            _libc_free(ctypes.cast(p, ctypes.c_void_p))

    def stats(self):
        """The server's counters, a dict name -> int (a tenant's own; an operator's
        (``--admin``) the server's)."""
        self.flush_frees()
        p = ctypes.POINTER(_lib.CounterC)()
        n = ctypes.c_size_t()
        self._call("tport_stats", ctypes.byref(p), ctypes.byref(n))
        try:
            return {_s(p[i].name): p[i].value for i in range(n.value)}
        finally:
            _libc_free(ctypes.cast(p, ctypes.c_void_p))
