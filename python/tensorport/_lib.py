"""_lib: finds and loads libtport, and declares its C API for ctypes.

ABI mode only: nothing is compiled when the package is installed.  The
structs below mirror include/tport.h and include/tport_types.h field by
field (same order, same C types, so ctypes lays them out as the C compiler
does); tests/test_abi.py checks every size and offset against the header.

libtport is a CDLL: ctypes releases the GIL around every call, so transfers
run while other Python threads work, and CFUNCTYPE callbacks (progress)
take the GIL back for as long as they run.

Where the library is looked for, in order:
  1. $TPORT_LIBRARY (a path; when set, nothing else is tried);
  2. the build tree of the checkout this package sits in (python/tensorport
     -> ../../build*/lib/libtport.so, build/ first), then ./build*/lib of the
     current directory when it is a checkout;
  3. the libtport this package was built beside, recorded when it was
     installed (tensorport/_install.py, written by python/_build);
  4. the system: ctypes.util.find_library("tport"), libtport.so.0 by the
     dynamic loader's search path (LD_LIBRARY_PATH, ld.so.cache), then
     sys.prefix/lib and /usr/local/lib.
"""
import ctypes
import ctypes.util
import glob
import os
import sys
import threading

HANDLE_BYTES = 16
NAME_MAX = 128
MAX_DIMS = 16
ERR_MSG_MAX = 256


class LibraryNotFoundError(ImportError):
    """libtport could not be loaded; the message lists every place tried and why each failed.

    Set ``TPORT_LIBRARY`` to the path of ``libtport.so`` (``build/lib/libtport.so``
    in a checkout after ``make``), or install it (``make install``) where the
    dynamic loader finds it.
    """


# ---------------------------------------------------------------- structs


class Err(ctypes.Structure):
    """tport_err: a status and a message."""

    _fields_ = [("code", ctypes.c_int), ("msg", ctypes.c_char * ERR_MSG_MAX)]


class Ref(ctypes.Structure):
    """tport_ref: a handle, or a name (then the handle is all zero)."""

    _fields_ = [("handle", ctypes.c_uint8 * HANDLE_BYTES), ("name", ctypes.c_char * NAME_MAX)]


class TensorInfoC(ctypes.Structure):
    """tport_tensor_info."""

    _fields_ = [
        ("ref", Ref),
        ("dtype", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("sizes", ctypes.c_int64 * MAX_DIMS),
        ("strides", ctypes.c_int64 * MAX_DIMS),
        ("storage_offset", ctypes.c_int64),
        ("device", ctypes.c_char * 32),
        ("actual_format", ctypes.c_int),
        ("suggested_format", ctypes.c_int),
        ("is_contiguous", ctypes.c_bool),
        ("nbytes", ctypes.c_int64),
        ("storage_nbytes", ctypes.c_int64),
        ("managed", ctypes.c_bool),
        ("conj", ctypes.c_bool),
        ("neg", ctypes.c_bool),
        ("expires_unix_ms", ctypes.c_int64),
    ]


class ConnectOptions(ctypes.Structure):
    """tport_connect_options."""

    _fields_ = [
        ("tenant", ctypes.c_char_p),
        ("timeout_ms", ctypes.c_int),
        ("keep", ctypes.c_bool),
        ("secret", ctypes.c_char_p),
        ("secret_file", ctypes.c_char_p),
        ("tls_ca", ctypes.c_char_p),
        ("tls_cert", ctypes.c_char_p),
        ("tls_key", ctypes.c_char_p),
        ("tls_server_name", ctypes.c_char_p),
        ("verify", ctypes.c_bool),
        ("no_shm", ctypes.c_bool),
    ]


# void (*tport_progress_fn)(void *arg, uint64_t done, uint64_t total)
PROGRESS_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64)


class PutOptions(ctypes.Structure):
    """tport_put_options."""

    _fields_ = [
        ("name", ctypes.c_char_p),
        ("ttl_ms", ctypes.c_uint64),
        ("device", ctypes.c_char_p),
        ("has_dtype", ctypes.c_bool),
        ("dtype", ctypes.c_int),
        ("memory_format", ctypes.c_int),
        ("managed", ctypes.c_bool),
        ("non_blocking", ctypes.c_bool),
        ("progress", PROGRESS_FN),
        ("progress_arg", ctypes.c_void_p),
        ("replace", ctypes.c_bool),
    ]


class ToOptions(ctypes.Structure):
    """tport_to_options."""

    _fields_ = [
        ("device", ctypes.c_char_p),
        ("has_dtype", ctypes.c_bool),
        ("dtype", ctypes.c_int),
        ("has_memory_format", ctypes.c_bool),
        ("memory_format", ctypes.c_int),
        ("copy", ctypes.c_bool),
        ("non_blocking", ctypes.c_bool),
        ("exact_format", ctypes.c_bool),
        ("name", ctypes.c_char_p),
        ("ttl_ms", ctypes.c_uint64),
    ]


class DeviceInfoC(ctypes.Structure):
    """tport_device_info."""

    _fields_ = [
        ("device", ctypes.c_char * 32),
        ("name", ctypes.c_char * 64),
        ("total_bytes", ctypes.c_uint64),
        ("free_bytes", ctypes.c_uint64),
        ("compute_capability", ctypes.c_char * 16),
        ("npeers", ctypes.c_int),
        ("peers", (ctypes.c_char * 32) * 16),
        ("managed_memory", ctypes.c_bool),
        ("free_hidden", ctypes.c_bool),
    ]


class CounterC(ctypes.Structure):
    """tport_counter."""

    _fields_ = [("name", ctypes.c_char * 48), ("value", ctypes.c_int64)]


# DLPack 0.6 (dlpack/dlpack.h), what tport_put_dlpack/tport_get_dlpack take and give.


class DLDevice(ctypes.Structure):
    """DLDevice."""

    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class DLDataType(ctypes.Structure):
    """DLDataType."""

    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    """DLTensor."""

    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    """DLManagedTensor (its deleter is declared as taking a void pointer)."""


DL_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
DLManagedTensor._fields_ = [
    ("dl_tensor", DLTensor),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", DL_DELETER),
]

# void (*tport_request_fn)(tport_request *req, int status, void *arg)
REQUEST_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p)


class PutItem(ctypes.Structure):
    """tport_put_item: one element of tport_put_batch."""

    _fields_ = [
        ("dtype", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("sizes", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("data", ctypes.c_void_p),
        ("nbytes", ctypes.c_size_t),
        ("opts", ctypes.POINTER(PutOptions)),
        ("info", TensorInfoC),
        ("err", Err),
    ]


class GetItem(ctypes.Structure):
    """tport_get_item: one element of tport_get_batch."""

    _fields_ = [
        ("ref", Ref),
        ("buf", ctypes.c_void_p),
        ("cap", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("nbytes", ctypes.c_size_t),
        ("info", TensorInfoC),
        ("err", Err),
    ]


# ---------------------------------------------------------------- prototypes

_P = ctypes.POINTER
_c = ctypes
_PROTOTYPES = {
    "tport_strerror": (_c.c_char_p, [_c.c_int]),
    "tport_parse_size": (_c.c_int, [_c.c_char_p, _c.c_char_p, _P(_c.c_uint64), _P(Err)]),
    "tport_parse_duration_ms": (_c.c_int, [_c.c_char_p, _c.c_char_p, _c.c_bool, _P(_c.c_uint64),
                                           _P(Err)]),
    "tport_status_name": (_c.c_char_p, [_c.c_int]),
    "tport_connect": (_c.c_int, [_c.c_char_p, _P(ConnectOptions), _P(_c.c_void_p), _P(Err)]),
    "tport_close": (None, [_c.c_void_p]),
    "tport_ref_name": (None, [_P(Ref), _c.c_char_p]),
    "tport_ref_format": (None, [_P(Ref), _c.c_char_p, _c.c_size_t]),
    "tport_ref_parse": (_c.c_int, [_c.c_char_p, _P(Ref), _P(Err)]),
    "tport_put_options_init": (None, [_P(PutOptions)]),
    "tport_put": (
        _c.c_int,
        [_c.c_void_p, _c.c_int, _c.c_int, _P(_c.c_int64), _P(_c.c_int64), _c.c_void_p,
         _c.c_size_t, _P(PutOptions), _P(TensorInfoC), _P(Err)],
    ),
    "tport_get": (
        _c.c_int,
        [_c.c_void_p, _P(Ref), _c.c_void_p, _c.c_size_t, _P(TensorInfoC), PROGRESS_FN,
         _c.c_void_p, _P(Err)],
    ),
    "tport_info": (_c.c_int, [_c.c_void_p, _P(Ref), _P(TensorInfoC), _P(Err)]),
    "tport_info_wait": (_c.c_int, [_c.c_void_p, _P(Ref), _c.c_uint32, _P(TensorInfoC), _P(Err)]),
    "tport_to": (
        _c.c_int,
        [_c.c_void_p, _P(Ref), _P(ToOptions), _P(TensorInfoC), _P(_c.c_bool), _P(Err)],
    ),
    "tport_copy": (_c.c_int, [_c.c_void_p, _P(Ref), _P(Ref), _c.c_bool, _P(Err)]),
    "tport_view": (
        _c.c_int,
        [_c.c_void_p, _P(Ref), _c.c_int, _P(_c.c_int64), _P(_c.c_int64), _c.c_int64,
         _c.c_char_p, _P(TensorInfoC), _P(Err)],
    ),
    "tport_contiguous": (
        _c.c_int,
        [_c.c_void_p, _P(Ref), _c.c_int, _c.c_char_p, _P(TensorInfoC), _P(_c.c_bool), _P(Err)],
    ),
    "tport_free": (_c.c_int, [_c.c_void_p, _P(Ref), _P(Err)]),
    "tport_free_many": (_c.c_int, [_c.c_void_p, _P(Ref), _c.c_size_t, _P(_c.c_size_t), _P(Err)]),
    "tport_sync": (_c.c_int, [_c.c_void_p, _P(Ref), _P(Err)]),
    "tport_list": (_c.c_int, [_c.c_void_p, _P(_P(TensorInfoC)), _P(_c.c_size_t), _P(Err)]),
    "tport_list_named": (_c.c_int, [_c.c_void_p, _c.c_char_p, _P(_P(TensorInfoC)),
                                    _P(_c.c_size_t), _P(Err)]),
    "tport_devices": (
        _c.c_int,
        [_c.c_void_p, _P(_P(DeviceInfoC)), _P(_c.c_size_t), _c.c_char_p, _c.c_size_t, _P(Err)],
    ),
    "tport_stats": (_c.c_int, [_c.c_void_p, _P(_P(CounterC)), _P(_c.c_size_t), _P(Err)]),
    "tport_put_dlpack": (
        _c.c_int,
        [_c.c_void_p, _c.c_void_p, _P(PutOptions), _P(TensorInfoC), _P(Err)],
    ),
    "tport_get_dlpack": (_c.c_int, [_c.c_void_p, _P(Ref), _P(_c.c_void_p), _P(Err)]),
    "tport_get_into_dlpack": (
        _c.c_int,
        [_c.c_void_p, _P(Ref), _c.c_void_p, _P(TensorInfoC), _P(Err)],
    ),
    "tport_put_dlpack_async": (
        _c.c_int,
        [_c.c_void_p, _c.c_void_p, _P(PutOptions), _P(TensorInfoC), REQUEST_FN, _c.c_void_p,
         _P(_c.c_void_p), _P(Err)],
    ),
    "tport_get_async": (
        _c.c_int,
        [_c.c_void_p, _P(Ref), _c.c_void_p, _c.c_size_t, _P(TensorInfoC), REQUEST_FN,
         _c.c_void_p, _P(_c.c_void_p), _P(Err)],
    ),
    "tport_copy_async": (
        _c.c_int,
        [_c.c_void_p, _P(Ref), _P(Ref), _c.c_bool, REQUEST_FN, _c.c_void_p, _P(_c.c_void_p),
         _P(Err)],
    ),
    "tport_put_batch": (_c.c_int, [_c.c_void_p, _P(PutItem), _c.c_size_t, _P(Err)]),
    "tport_get_batch": (_c.c_int, [_c.c_void_p, _P(GetItem), _c.c_size_t, _P(Err)]),
    "tport_get_batch_async": (
        _c.c_int,
        [_c.c_void_p, _P(GetItem), _c.c_size_t, REQUEST_FN, _c.c_void_p, _P(_c.c_void_p),
         _P(Err)],
    ),
    "tport_get_batch_dlpack": (
        _c.c_int, [_c.c_void_p, _P(GetItem), _c.c_size_t, _P(_c.c_void_p), _P(Err)]),
    "tport_get_batch_dlpack_async": (
        _c.c_int,
        [_c.c_void_p, _P(GetItem), _c.c_size_t, _P(_c.c_void_p), REQUEST_FN, _c.c_void_p,
         _P(_c.c_void_p), _P(Err)],
    ),
    "tport_info_async": (
        _c.c_int,
        [_c.c_void_p, _P(Ref), _c.c_uint32, _P(TensorInfoC), REQUEST_FN, _c.c_void_p,
         _P(_c.c_void_p), _P(Err)],
    ),
    "tport_to_async": (
        _c.c_int,
        [_c.c_void_p, _P(Ref), _P(ToOptions), _P(TensorInfoC), _P(_c.c_bool), REQUEST_FN,
         _c.c_void_p, _P(_c.c_void_p), _P(Err)],
    ),
    "tport_request_error": (_P(Err), [_c.c_void_p]),
    "tport_wait": (_c.c_int, [_c.c_void_p, _c.c_int, _P(Err)]),
    "tport_cancel": (None, [_c.c_void_p]),
    "tport_request_free": (None, [_c.c_void_p]),
}

# ---------------------------------------------------------------- loading

_lock = threading.Lock()
_lib = None
_path = None


def _checkout_root(start):
    """The checkout above start (a folder holding include/tport.h), or None."""
    d = os.path.abspath(start)
    for _ in range(3):
        if os.path.isfile(os.path.join(d, "include", "tport.h")):
            return d
        d = os.path.dirname(d)
    return None


def _build_tree_candidates(root):
    """libtport in root's build folders: build/ first, then build*/ newest first."""
    found = []
    for d in glob.glob(os.path.join(root, "build*", "lib")):
        for name in ("libtport.so", "libtport.so.0"):
            p = os.path.join(d, name)
            if os.path.exists(p):
                found.append(p)
                break
    first = [p for p in found if os.path.basename(os.path.dirname(os.path.dirname(p))) == "build"]
    rest = sorted((p for p in found if p not in first), key=os.path.getmtime, reverse=True)
    return first + rest


def _recorded_library():
    """The libtport recorded at install (None in a checkout, or when none was built)."""
    try:
        from . import _install
    except ImportError:
        return None
    return getattr(_install, "LIBRARY", None)


def candidates():
    """Every path or name the loader will try, in order (see the module's docstring)."""
    env = os.environ.get("TPORT_LIBRARY")
    if env:
        return [env]
    out = []
    for start in (os.path.dirname(os.path.abspath(__file__)), os.getcwd()):
        root = _checkout_root(start)
        if root:
            out += [p for p in _build_tree_candidates(root) if p not in out]
    recorded = _recorded_library()
    if recorded and recorded not in out:
        out.append(recorded)
    found = ctypes.util.find_library("tport")
    if found:
        out.append(found)
    out += ["libtport.so.0", "libtport.so"]
    for d in (os.path.join(sys.prefix, "lib"), "/usr/local/lib"):
        p = os.path.join(d, "libtport.so.0")
        if p not in out:
            out.append(p)
    return out


def _sanitizer_missing(path):
    """The sanitizer runtime path needs and this process lacks ("libasan"), or None.

    A library built with -fsanitize=address or thread aborts the process when
    loaded into one that did not start with its runtime, so such a build
    folder is skipped (or refused, when named by TPORT_LIBRARY) instead.
    """
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None  # a loader name, or unreadable: let dlopen say why
    for rt in (b"libasan.so", b"libtsan.so"):
        if rt in data:
            try:
                with open("/proc/self/maps", "rb") as f:
                    if rt in f.read():
                        continue
            except OSError:
                pass
            return rt.decode().split(".")[0]
    return None


def _declare(lib):
    for name, (res, args) in _PROTOTYPES.items():
        f = getattr(lib, name)  # AttributeError: not libtport, or too old
        f.restype = res
        f.argtypes = args


def load():
    """Loads libtport once (thread-safe) and returns the CDLL; raises LibraryNotFoundError."""
    global _lib, _path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        tried = []
        from_env = bool(os.environ.get("TPORT_LIBRARY"))
        for cand in candidates():
            rt = _sanitizer_missing(cand)
            if rt:
                tried.append("  %s: built with a sanitizer (needs %s preloaded): skipped"
                             % (cand, rt))
                continue
            try:
                lib = ctypes.CDLL(cand)
                _declare(lib)
            except (OSError, AttributeError) as e:
                tried.append("  %s: %s" % (cand, e))
                continue
            _lib, _path = lib, cand
            return lib
        if not from_env and not any(
            _checkout_root(d) for d in (os.path.dirname(os.path.abspath(__file__)), os.getcwd())
        ):
            tried.append("  (no build tree: neither this package nor the current directory "
                         "is in a tensorport checkout)")
        hint = (
            "TPORT_LIBRARY is set: point it at a loadable libtport.so"
            if from_env
            else "set TPORT_LIBRARY to the path of libtport.so (build/lib/libtport.so after "
            "`make` in a checkout), or `make install` it where the dynamic loader looks"
        )
        raise LibraryNotFoundError(
            "tensorport: cannot load libtport; tried:\n%s\n%s" % ("\n".join(tried), hint)
        )


def library_path():
    """The path (or loader name) libtport was loaded from, loading it if needed."""
    load()
    return _path
