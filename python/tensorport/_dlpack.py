"""_dlpack: host tensors in and out of libtport through DLPack (version 0.6).

In (a put): a PyTorch tensor goes through torch.utils.dlpack.to_dlpack, a
NumPy array through its own __dlpack__, anything else with __dlpack__
through that; libtport's tport_put_dlpack reads the DLTensor (any strides:
dense layouts travel as they are, others are packed in C order).  GPU
memory (kDLCUDA, kDLCUDAManaged) goes to libtport as it is, which stages it
through the client's pinned chunks: a torch cuda tensor that is not dense
is made contiguous on its device first, and its stream is synchronized (the
copies run on libtport's stream, ordered after the legacy default stream
only); other CUDA objects are asked for __dlpack__(stream=1), DLPack's
legacy default stream.  What the
exporters refuse is described to libtport by a DLTensor built here over the
same memory: read-only NumPy arrays (broadcast_to, memory maps), bfloat16
arrays (ml_dtypes, or uint16 bit patterns).  DLPack 0.6 has no bool: bool
travels as its uint8 bytes and the put converts them back (exactly: bytes 0
and 1 give the same values in every dtype).

Out (a get): tport_get_dlpack hands over a DLManagedTensor (contiguous host
memory that libtport allocated; its deleter frees it).  PyTorch takes it
through torch.utils.dlpack.from_dlpack as a capsule; NumPy gets a writable
array over the same memory (np.from_dlpack would make it read-only in NumPy
1.x), which calls the deleter when the last view of it goes.  Tensor objects
also implement __dlpack__, so np.from_dlpack(t) and torch.from_dlpack(t)
download them.
"""
import ctypes
import sys

from . import _lib, _names
from .errors import DataLoss, InvalidArgument

kDLCPU = 1
kDLCUDA = 2
kDLCUDAHost = 3
kDLCUDAManaged = 13
_DEVICE_TYPES = (kDLCPU, kDLCUDA, kDLCUDAHost, kDLCUDAManaged)
kDLInt, kDLUInt, kDLFloat, kDLBfloat, kDLComplex = 0, 1, 2, 4, 5

_CODES = {
    "uint8": (kDLUInt, 8),
    "int8": (kDLInt, 8),
    "int16": (kDLInt, 16),
    "int32": (kDLInt, 32),
    "int64": (kDLInt, 64),
    "float16": (kDLFloat, 16),
    "bfloat16": (kDLBfloat, 16),
    "float32": (kDLFloat, 32),
    "float64": (kDLFloat, 64),
    "complex64": (kDLComplex, 64),
    "complex128": (kDLComplex, 128),
}

# ---------------------------------------------------------------- capsules

_api = ctypes.pythonapi
_capsule_new = ctypes.PYFUNCTYPE(
    ctypes.py_object, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p
)(("PyCapsule_New", _api))
_capsule_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", _api)
)
# the same two on a raw PyObject* (inside a capsule's destructor its refcount is 0)
_raw_is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_IsValid", _api)
)
_raw_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", _api)
)
_NAME = ctypes.create_string_buffer(b"dltensor")  # lives as long as the module: capsules keep it


def call_deleter(ptr):
    """Runs a DLManagedTensor's deleter (frees what libtport allocated)."""
    m = _lib.DLManagedTensor.from_address(ptr)
    if m.deleter:
        m.deleter(ptr)


def _destroy(addr):
    # A capsule nobody consumed still has its name "dltensor" (consumers
    # rename it "used_dltensor" and call the deleter themselves).
    if _raw_is_valid(addr, b"dltensor"):
        call_deleter(_raw_pointer(addr, b"dltensor"))


_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(_destroy)


def capsule_from_managed(ptr):
    """A "dltensor" capsule owning the DLManagedTensor at ptr (unconsumed: deleted with it)."""
    return _capsule_new(ptr, ctypes.addressof(_NAME), ctypes.cast(_DESTRUCTOR, ctypes.c_void_p))


def capsule_pointer(capsule):
    """The DLManagedTensor* inside a "dltensor" capsule (its DLTensor is at the same address)."""
    try:
        return _capsule_pointer(capsule, b"dltensor")
    except (ValueError, TypeError) as e:
        raise InvalidArgument("__dlpack__ returned %r, not an unused DLPack capsule (%s)"
                              % (capsule, e)) from None


# ---------------------------------------------------------------- out


class _Memory:
    """The base of a NumPy array over a DLManagedTensor's memory (through its
    ``__array_interface__``): runs the tensor's deleter when the array and all its views
    are gone.  It keeps the deleter itself (nothing to look up at exit).  Cheaper than a
    ctypes array with a weakref.finalize (a get_dict makes one per value)."""

    __slots__ = ("__array_interface__", "_ptr", "_deleter")

    def __init__(self, ptr, deleter, interface):
        self._ptr = ptr
        self._deleter = deleter
        self.__array_interface__ = interface

    def __del__(self):
        if self._deleter:
            self._deleter(self._ptr)


def numpy_from_managed(ptr, dtype):
    """A writable NumPy array (dtype, C order) over a DLManagedTensor's memory, taking
    ownership: the deleter runs when the array and all its views are gone (or at once,
    with DataLoss, when dtype's size is not the DLTensor's element's: the array would
    reach past its memory)."""
    import numpy as np

    try:
        m = _lib.DLManagedTensor.from_address(ptr)
        t = m.dl_tensor
        shape = tuple(t.shape[: t.ndim]) if t.ndim > 0 else ()
        element = t.dtype.bits // 8 * t.dtype.lanes
        if dtype.itemsize != element or any(s < 0 for s in shape):
            raise DataLoss("a tensor of %d-byte elements and shape %s read as %s"
                           % (element, shape, dtype))
        n = 1
        for s in shape:
            n *= s
        if n == 0:  # (NumPy reads a NULL address as no interface at all)
            call_deleter(ptr)
            return np.empty(shape, dtype)
        if not t.data:
            raise DataLoss("a tensor of %d elements at address NULL" % n)
        # NumPy's own dtypes by their type string; another (ml_dtypes' bfloat16) as
        # its bytes, viewed as it below
        own = dtype.isbuiltin == 1
        interface = {"data": (t.data + t.byte_offset, False), "version": 3,
                     "shape": shape if own else (n * element,),
                     "typestr": dtype.str if own else "|u1"}
        memory = _Memory(ptr, m.deleter, interface)
    except BaseException:
        call_deleter(ptr)  # it was handed over: nobody else frees it
        raise
    a = np.asarray(memory)
    return a if own else a.view(dtype).reshape(shape)


def torch_from_managed(ptr, name):
    """A torch.Tensor (CPU) owning a DLManagedTensor, through torch.utils.dlpack; bool
    (which DLPack 0.6 carries as uint8) is viewed back as bool."""
    import torch.utils.dlpack

    cap = capsule_from_managed(ptr)  # from here on the capsule owns ptr
    t = torch.utils.dlpack.from_dlpack(cap)
    return t.view(torch.bool) if name == "bool" else t


# ---------------------------------------------------------------- in


class Exported:
    """A host tensor described to libtport: the DLTensor's address, what keeps its memory
    alive until the put returns, and whether its uint8 bytes stand for bool."""

    __slots__ = ("address", "keepalive", "is_bool", "nbytes")

    def __init__(self, address, keepalive, is_bool, nbytes):
        self.address = address
        self.keepalive = keepalive
        self.is_bool = is_bool
        self.nbytes = nbytes


def _dltensor(data, shape, strides, dtype, device=None):
    """A DLTensor over memory of device (a DLDevice; None: host; strides in elements;
    dtype a name or a DLDataType); returns (struct, keepalive)."""
    n = max(len(shape), 1)
    sh = (ctypes.c_int64 * n)(*shape)
    st = (ctypes.c_int64 * n)(*strides)
    if isinstance(dtype, str):
        dtype = _lib.DLDataType(*_CODES[dtype], 1)
    t = _lib.DLTensor(
        data=data,
        device=device if device is not None else _lib.DLDevice(kDLCPU, 0),
        ndim=len(shape),
        dtype=dtype,
        shape=ctypes.cast(sh, ctypes.POINTER(ctypes.c_int64)),
        strides=ctypes.cast(st, ctypes.POINTER(ctypes.c_int64)),
        byte_offset=0,
    )
    return t, (sh, st)


def _nbytes(shape, itemsize):
    n = itemsize
    for s in shape:
        n *= s
    return n


def _dense(shape, strides):
    """Every element used once (libtport's test of a layout it sends as it is)."""
    want = 1
    for s, st in sorted(zip(shape, strides), key=lambda p: p[1]):
        if s == 1:
            continue
        if s == 0:
            return True
        if st != want:
            return False
        want *= s
    return True


def _from_torch(t):
    import torch
    import torch.utils.dlpack

    t = t.detach()
    if t.device.type not in ("cpu", "cuda"):
        raise InvalidArgument("the tensor is on %s: put takes host and cuda tensors" % t.device)
    if t.layout != torch.strided:
        raise InvalidArgument("the tensor's layout is %s: only strided tensors can be put"
                              % t.layout)
    # DLPack has no conj/neg bits: materialize them
    t = t.resolve_conj().resolve_neg()
    name = str(t.dtype)[6:]
    if name not in _names.DTYPE_NUMBER:
        raise InvalidArgument("dtype is %s: tensorport has %s"
                              % (t.dtype, ", ".join(_names.DTYPES)))
    is_bool = name == "bool"
    if is_bool:
        t = t.view(torch.uint8)
    if t.device.type == "cuda":
        if not _dense(t.shape, t.stride()):
            t = t.contiguous()  # packed on its device, never through the host
        # libtport's copies wait for the legacy default stream only
        torch.cuda.current_stream(t.device).synchronize()
    cap = torch.utils.dlpack.to_dlpack(t)
    ptr = capsule_pointer(cap)
    nbytes = t.numel() * t.element_size()
    dl = _lib.DLTensor.from_address(ptr)
    st = t.stride()
    if dl.strides and all(dl.strides[d] == st[d] for d in range(t.dim())):
        return Exported(ptr, (t, cap), is_bool, nbytes)
    # PyTorch 1.13 exports the stride of every size-1 dim as 1, and PyTorch's
    # own rules (suggest_memory_format, so to()'s aliasing) read those
    # strides: the same memory is described with the tensor's true strides.
    dev = _lib.DLDevice(dl.device.device_type, dl.device.device_id)
    own, keep = _dltensor((dl.data or 0) + dl.byte_offset, tuple(t.shape), st, dl.dtype, dev)
    return Exported(ctypes.addressof(own), (t, cap, own, keep), is_bool, nbytes)


def _from_numpy(a):
    import numpy as np

    if not a.dtype.isnative:
        a = a.astype(a.dtype.newbyteorder("="))
    name = _names.numpy_to_name(a.dtype)
    if name is None:
        raise InvalidArgument("dtype is %s: tensorport has %s (bfloat16 as ml_dtypes.bfloat16 "
                              "or uint16 bit patterns)" % (a.dtype, ", ".join(_names.DTYPES)))
    size = a.dtype.itemsize
    if any(s < 0 or s % size for s in a.strides):
        a = np.array(a, order="C")  # negative or misaligned strides: a C-order copy
    is_bool = name == "bool"
    if is_bool:
        a, name = a.view(np.uint8), "uint8"
    nbytes = a.size * size
    if name != "bfloat16" and a.flags.writeable:
        try:
            cap = a.__dlpack__()
            return Exported(capsule_pointer(cap), (a, cap), is_bool, nbytes)
        except (BufferError, TypeError, AttributeError, ValueError):
            pass  # described below instead
    t, keep = _dltensor(
        a.__array_interface__["data"][0], a.shape, [s // size for s in a.strides], name
    )
    return Exported(ctypes.addressof(t), (a, t, keep), is_bool, nbytes)


def export_out(obj):
    """Describes obj (a torch.Tensor, CPU or CUDA, or anything with __dlpack__) as the
    DLTensor a get writes into: contiguous, written in place (never a copy of it)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        if not obj.is_contiguous() or obj.is_conj() or obj.is_neg():
            raise InvalidArgument("out must be a contiguous tensor without conj/neg bits: a "
                                  "get writes its values in logical C order")
        if obj.requires_grad:
            raise InvalidArgument("out requires grad: give out.detach() (or a tensor without "
                                  "requires_grad)")
    return export(obj)


def _from_capsule(cap):
    """A legacy DLPack capsule (torch.utils.dlpack.to_dlpack, cupy's toDlpack): read,
    not consumed -- it stays "dltensor" and its producer's deleter runs when it is
    collected, so the caller may still hand it to another consumer.  A legacy
    capsule carries no stream: device memory must be ready when it is put."""
    ptr = capsule_pointer(cap)
    t = _lib.DLTensor.from_address(ptr)
    if int(t.device.device_type) not in _DEVICE_TYPES:
        raise InvalidArgument("the capsule's tensor is on DLPack device (%d, %d): put takes "
                              "host and CUDA memory" % (t.device.device_type, t.device.device_id))
    nb = _nbytes([t.shape[i] for i in range(t.ndim)], max(t.dtype.bits // 8, 1))
    return Exported(ptr, (cap,), False, nb)


def export(obj):
    """Describes obj (a NumPy array, a CPU torch.Tensor, anything with __dlpack__, a
    legacy "dltensor" capsule, or anything numpy.asarray takes) as a DLTensor for
    tport_put_dlpack."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        return _from_torch(obj)
    np = sys.modules.get("numpy")
    if np is not None and isinstance(obj, np.ndarray):
        return _from_numpy(obj)
    if type(obj).__name__ == "PyCapsule":
        return _from_capsule(obj)
    if hasattr(obj, "__dlpack__"):
        on_gpu = False
        if hasattr(obj, "__dlpack_device__"):
            dev = tuple(obj.__dlpack_device__())
            if int(dev[0]) not in _DEVICE_TYPES:
                raise InvalidArgument(
                    "the object is on DLPack device %s: put takes host and CUDA memory" % (dev,)
                )
            on_gpu = int(dev[0]) in (kDLCUDA, kDLCUDAManaged)
        # stream=1: the producer orders its work before the legacy default stream
        cap = obj.__dlpack__(stream=1) if on_gpu else obj.__dlpack__()
        ptr = capsule_pointer(cap)
        t = _lib.DLTensor.from_address(ptr)
        nb = _nbytes([t.shape[i] for i in range(t.ndim)], max(t.dtype.bits // 8, 1))
        return Exported(ptr, (obj, cap), False, nb)
    import numpy

    try:
        a = numpy.asarray(obj)
    except Exception as e:
        raise InvalidArgument("cannot put a %s: give a NumPy array, a torch.Tensor or an object "
                              "with __dlpack__ (%s)" % (type(obj).__name__, e)) from None
    if a.dtype == object:
        raise InvalidArgument("cannot put a %s: give a NumPy array, a torch.Tensor or an object "
                              "with __dlpack__" % type(obj).__name__)
    return _from_numpy(a)
