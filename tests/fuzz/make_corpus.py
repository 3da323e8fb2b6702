#!/usr/bin/python3
"""make_corpus.py: writes the seed corpora of tests/fuzz (corpus/frame,
corpus/npy, corpus/server) from scratch.

Seeds are valid inputs that reach deep quickly: a frame of every request
type (and a few replies), .npy files of several dtypes, orders and byte
orders, and request sequences for the in-process server that put, get, view,
convert, copy and free tensors.  There is no Python protobuf module on the
build machines, so the few messages needed are encoded here by hand from
proto/tport.proto's field numbers.  Run it after changing the wire format:

    tests/fuzz/make_corpus.py    # Debian's python3 + python3-numpy; rewrites the three directories

Inputs found by fuzzing never go into these directories (`make fuzz` works
on a scratch copy); those that crashed go to regressions/<harness>/.
"""
import os
import shutil
import struct
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))

# ---------------------------------------------------------------- protobuf


def varint(v):
    v &= (1 << 64) - 1  # negative int64: ten bytes, two's complement
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def f_varint(num, v):
    return varint(num << 3) + varint(int(v)) if v else b""


def f_bytes(num, b):
    if isinstance(b, str):
        b = b.encode()
    return varint(num << 3 | 2) + varint(len(b)) + b if b else b""


def f_msg(num, m):
    return varint(num << 3 | 2) + varint(len(m)) + m  # present even when empty


def f_fixed64(num, v):
    return varint(num << 3 | 1) + int(v).to_bytes(8, "little") if v else b""


def f_packed(num, vals):
    body = b"".join(varint(v) for v in vals)
    return varint(num << 3 | 2) + varint(len(body)) + body if vals else b""


# tport.proto's numbers
METHODS = dict(HELLO=1, DEVICES=2, PUT_BEGIN=3, PUT_CHUNK=4, PUT_COMMIT=5, PUT_ABORT=6,
               GET_BEGIN=7, GET_CHUNK=8, TO=9, COPY=10, VIEW=11, CONTIGUOUS=12, INFO=13,
               LIST=14, FREE=15, SYNC=16, STATS=17, SHM_REGISTER=18, SHM_RELEASE=19,
               PUT_BATCH=20, GET_BATCH=21)
DTYPES = dict(bool=0, uint8=1, int8=2, int16=3, int32=4, int64=5, float16=6, bfloat16=7,
              float32=8, float64=9, complex64=10, complex128=11)
MF = dict(contiguous=0, channels_last=1, channels_last_3d=2, preserve=3)
ESIZE = dict(bool=1, uint8=1, int8=1, int16=2, int32=4, int64=8, float16=2, bfloat16=2,
             float32=4, float64=8, complex64=8, complex128=16)


def ref(slot=None, name=None):
    """A Ref: slot k is a 1-byte handle, which fuzz_server replaces with the
    k-th handle its replies gave (a real server would just say not found)."""
    return f_bytes(1, bytes([slot]) if slot is not None else b"") + f_bytes(2, name or "")


def desc(dtype, sizes, strides=(), offset=0, device=""):
    return (f_varint(1, DTYPES[dtype]) + f_packed(2, sizes) + f_packed(3, strides) +
            f_varint(4, offset) + f_bytes(5, device))


def hello(tenant=""):
    return f_varint(1, 1) + f_bytes(2, "fuzz") + f_bytes(3, tenant)


def put_begin(d, name="", device="", dtype=None, fmt="preserve", commit=False, keep=False,
              non_blocking=False, managed=False, ttl_ms=0, replace=False):
    m = f_msg(1, d) + f_bytes(2, name) + f_varint(3, ttl_ms) + f_bytes(4, device)
    if dtype is not None:
        m += f_varint(5, DTYPES[dtype]) + f_varint(9, 1)
    return (m + f_varint(6, MF[fmt]) + f_varint(7, managed) + f_varint(8, non_blocking) +
            f_varint(10, keep) + f_varint(11, commit) + f_varint(15, replace))


def put_chunk(r, offset):
    return f_msg(1, r) + f_varint(2, offset)


def put_commit(r, non_blocking=False):
    return f_msg(1, r) + f_varint(2, non_blocking)


def only_ref(r):  # PutAbort, Info, Free
    return f_msg(1, r)


def info_wait(r, wait_ms):
    return f_msg(1, r) + f_varint(2, wait_ms)


def free_refs(*refs):  # FreeRequest.refs: many at once
    return b"".join(f_msg(2, r) for r in refs)


def get_begin(r, inline_max=0, wait_ms=0, expect=None):
    # expect: (dtype, sizes), GetBeginRequest.expect_* (checked before a byte is written)
    m = f_msg(1, r) + f_varint(2, inline_max) + f_varint(8, wait_ms)
    if expect:
        m += f_varint(9, DTYPES[expect[0]]) + f_packed(10, expect[1]) + f_varint(11, 1)
    return m


def slice_(region, offset, length):
    return f_varint(1, region) + f_varint(2, offset) + f_varint(3, length)


def get_chunk(transfer_slot, offset, length):
    return f_bytes(1, bytes([transfer_slot])) + f_varint(2, offset) + f_varint(3, length)


def to(r, device="", dtype=None, fmt=None, copy=False, non_blocking=False, exact=False, name="",
       keep=False):
    m = f_msg(1, r) + f_bytes(2, device)
    if dtype is not None:
        m += f_varint(3, DTYPES[dtype]) + f_varint(10, 1)
    if fmt is not None:
        m += f_varint(4, MF[fmt]) + f_varint(11, 1)
    return (m + f_varint(5, copy) + f_varint(6, non_blocking) + f_varint(7, exact) +
            f_bytes(8, name) + f_varint(12, keep))


def copy(dst, src, non_blocking=False):
    return f_msg(1, dst) + f_msg(2, src) + f_varint(3, non_blocking)


def view(r, sizes, strides=(), offset=0, name=""):
    return (f_msg(1, r) + f_packed(2, sizes) + f_packed(3, strides) + f_varint(4, offset) +
            f_bytes(5, name))


def contiguous(r, fmt="contiguous"):
    return f_msg(1, r) + f_varint(2, MF[fmt])


def sync(r=None, device=""):
    return (f_msg(1, r) if r is not None else b"") + f_bytes(2, device)


def status(code=0, msg=""):
    return f_varint(1, code) + f_bytes(2, msg)


def info(r, d, nbytes, storage_nbytes):
    return (f_msg(1, r) + f_msg(2, d) + f_varint(5, 1) + f_varint(6, nbytes) +
            f_varint(11, storage_nbytes))


# ---------------------------------------------------------------- frames

FRAME_REPLY = 1


def frame(method, msg, payload=b"", flags=0):
    return struct.pack(">IBBHI", 0x54505254, 1, flags, METHODS[method], len(msg)) + msg + payload


def tensor_bytes(dtype, sizes):
    n = ESIZE[dtype]
    for s in sizes:
        n *= s
    return bytes((i * 37 + 11) & 0xFF for i in range(n))


def frame_seeds():
    h16 = bytes(range(16))
    r = f_bytes(1, h16)
    d = desc("float32", [2, 3])
    seeds = {
        "hello": frame("HELLO", hello("tenant-a")),
        "devices": frame("DEVICES", b""),
        "put_begin": frame("PUT_BEGIN", put_begin(d, device="sim:0")),
        "put_begin_commit": frame("PUT_BEGIN", put_begin(d, commit=True, dtype="float16"),
                                  tensor_bytes("float32", [2, 3])),
        "put_begin_strided": frame("PUT_BEGIN", put_begin(
            desc("uint8", [1, 3, 2, 2], [12, 1, 6, 3], 0, "sim:1"), fmt="channels_last")),
        "put_chunk": frame("PUT_CHUNK", put_chunk(r, 4096), b"\x01" * 64),
        "put_commit": frame("PUT_COMMIT", put_commit(r, True)),
        "put_abort": frame("PUT_ABORT", only_ref(r)),
        "get_begin": frame("GET_BEGIN", get_begin(f_bytes(2, "named"), 1 << 16)),
        "get_chunk": frame("GET_CHUNK", f_bytes(1, h16) + f_varint(2, 8192) + f_varint(3, 4096)),
        "to": frame("TO", to(r, device="sim:0", dtype="bfloat16", fmt="channels_last", copy=True)),
        "copy": frame("COPY", copy(r, f_bytes(2, "src"))),
        "view": frame("VIEW", view(r, [3, 2], [1, 3], 1)),
        "view_overlap": frame("VIEW", view(r, [1 << 20, 3], [1, 1], 0)),
        "contiguous": frame("CONTIGUOUS", contiguous(r, "channels_last")),
        "info": frame("INFO", only_ref(r)),
        "list": frame("LIST", b""),
        "free": frame("FREE", only_ref(r)),
        "sync": frame("SYNC", sync(None, "sim:1")),
        "stats": frame("STATS", b""),
        # replies: a client reads them with the same codec
        "reply_put_begin": frame("PUT_BEGIN", status() + f_msg(2, r) + f_varint(3, 4096) +
                                 f_varint(4, 8), flags=FRAME_REPLY),
        "reply_info": frame("INFO", status() + f_msg(2, info(r, desc("float64", [4, 5], [1, 4]),
                                                             160, 160)), flags=FRAME_REPLY),
        "reply_error": frame("TO", status(3, "dtype is 99: not a known dtype"),
                             flags=FRAME_REPLY),
        # frames the first byte must pick a method for
        "headless_view": bytes([METHODS["VIEW"] - 1]) + view(r, [2, 2], [2, 1]),
        "headless_put_begin": bytes([METHODS["PUT_BEGIN"] - 1]) + put_begin(
            desc("complex64", [3, 0, 2], [], 0)),
    }
    return seeds


# ---------------------------------------------------------------- npy


def npy_seeds():
    def save(a, version=None):
        import io
        b = io.BytesIO()
        if version:
            np.lib.format.write_array(b, a, version=version)
        else:
            np.save(b, a)
        return b.getvalue()

    ar = np.arange
    return {
        "f4_c_2x3": save(ar(6, dtype="<f4").reshape(2, 3)),
        "f8_fortran_3x4": save(np.asfortranarray(ar(12, dtype="<f8").reshape(3, 4))),
        "i4_big_endian": save(ar(5, dtype=">i4")),
        "c8_big_endian_2x2": save((ar(4) + 1j * ar(4)).astype(">c8").reshape(2, 2)),
        "c16_fortran": save(np.asfortranarray((ar(6) - 2j).astype("<c16").reshape(2, 3))),
        "b1_bool": save(ar(7) % 2 == 0),
        "u1_empty_0x3": save(np.zeros((0, 3), dtype="u1")),
        "i1_scalar": save(np.array(-5, dtype="i1")),
        "u2_bfloat16": save(ar(4, dtype="<u2") + 0x3F80),
        "f2_half_4d": save(ar(16, dtype="<f2").reshape(1, 2, 2, 4)),
        "i8_big_fortran": save(np.asfortranarray(ar(6, dtype=">i8").reshape(3, 2))),
        "i2_v2_header": save(ar(3, dtype="<i2"), version=(2, 0)),
        "f4_v3_header": save(ar(2, dtype="<f4"), version=(3, 0)),
        "not_npy": b"PK\x03\x04 this is a zip file\n",
    }


# ---------------------------------------------------------------- server

# fuzz_server's op encoding (see the comment at the top of fuzz_server.c)
CTL_CONN, CTL_CTX, CTL_ASYNC, CTL_RAW = 1, 2, 4, 8


def op(method, msg, payload=b"", conn=0, ctx=0, async_=False):
    ctl = (CTL_CONN if conn else 0) | (CTL_CTX if ctx else 0) | (CTL_ASYNC if async_ else 0)
    return (bytes([ctl, METHODS[method] - 1]) + struct.pack("<HH", len(msg), len(payload)) + msg +
            payload)


def raw(data, conn=0):
    return bytes([CTL_RAW | (CTL_CONN if conn else 0)]) + struct.pack("<H", len(data)) + data


def put_multi(dtype, sizes, device="", dtype_to=None, fmt="preserve", name="", chunk=4096,
              slot=0, async_chunks=False, replace=False):
    """PutBegin, its chunks (4 KiB: the harness's server), PutCommit."""
    data = tensor_bytes(dtype, sizes)
    ops = op("PUT_BEGIN", put_begin(desc(dtype, sizes), name=name, device=device,
                                    dtype=dtype_to, fmt=fmt, replace=replace))
    for k, off in enumerate(range(0, len(data), chunk)):
        ops += op("PUT_CHUNK", put_chunk(ref(slot), off), data[off:off + chunk],
                  ctx=k % 2 if async_chunks else 0, async_=async_chunks)
    if async_chunks:  # both contexts' replies first: a commit waits for every chunk
        ops += op("INFO", only_ref(ref(slot)), ctx=0) + op("INFO", only_ref(ref(slot)), ctx=1)
    return ops + op("PUT_COMMIT", put_commit(ref(slot)))


def put_one(dtype, sizes, device="", dtype_to=None, fmt="preserve", name="", keep=False, conn=0,
            replace=False):
    return op("PUT_BEGIN", put_begin(desc(dtype, sizes), name=name, device=device, dtype=dtype_to,
                                     fmt=fmt, commit=True, keep=keep, replace=replace),
              tensor_bytes(dtype, sizes), conn=conn)


def put_batch(elements):
    """PutBatch of (desc, name, data) elements; returns (msg, payload)."""
    msg = b"".join(f_msg(1, put_begin(d, name=name, device="sim:0", commit=True, keep=bool(name)))
                   for d, name, _ in elements)
    return msg + f_packed(2, [len(data) for _, _, data in elements]), b"".join(
        data for _, _, data in elements)


def put_run(d, count, nbytes, crcs=None, offsets=None, shm=None, name=""):
    """A PutBatchRequest's PutRun: count elements as one PutBegin with commit."""
    put = put_begin(d, name=name, commit=True) + (f_msg(14, shm) if shm else b"") + (
        f_varint(13, 1) if crcs is not None else b"")
    fixed = b"".join(struct.pack("<I", c) for c in crcs or [])
    return (f_msg(1, put) + f_varint(2, count) + f_varint(3, nbytes) + f_packed(4, offsets or []) +
            (f_bytes(5, fixed) if fixed else b""))


def get_batch(names, inline_max):
    return b"".join(f_msg(1, get_begin(ref(name=n), inline_max)) for n in names)


def batch_seeds():
    bad_dtype = f_varint(1, 99) + f_packed(2, [4])
    good = [(desc("float32", [3]), "ba", tensor_bytes("float32", [3])),
            (bad_dtype, "bbad", b"\0" * 16),
            (desc("int16", [2, 1500]), "bc", tensor_bytes("int16", [2, 1500]))]
    msg, payload = put_batch(good)
    short_msg, short_payload = put_batch(good[:1])
    return {
        # good elements beside a bad one; then by name, inline and by transfer
        "put_batch_get_batch": op("PUT_BATCH", msg, payload) +
        op("GET_BATCH", get_batch(["ba", "bbad", "bc", "missing"], 1 << 16)) +
        op("GET_BATCH", get_batch(["bc", "ba"], 16)) +
        op("GET_CHUNK", get_chunk(0, 0, 4096)),
        # lengths that do not add up to the payload, and an element without commit
        # elements naming region slices (no region in the harness: not found),
        # one with shm_chunks, one too large for its slice, with defer_large
        "get_batch_slices": op("PUT_BATCH", msg, payload) +
        op("GET_BATCH", f_msg(1, get_begin(ref(name="ba"), 1 << 16) + f_msg(4, slice_(7, 0, 12))) +
           f_msg(1, get_begin(ref(name="bc"), 0) + f_msg(4, slice_(7, 16, 100)) + f_varint(5, 1)) +
           f_msg(1, get_begin(ref(name="bc"), 0) + f_msg(4, slice_(7, 0, 6000)) +
                 f_varint(12, 1)) +
           f_varint(2, 1)),
        # a process region's two steps (no region in the harness: refused), then
        # chunks naming an address as a process region's slice would: one chunk,
        # three at once, more than a read takes
        "process_region": op("SHM_REGISTER", f_varint(5, 1)) +
        op("SHM_REGISTER", f_varint(5, 1) + f_varint(6, 4096) + f_varint(7, 3)) +
        op("PUT_BEGIN", put_begin(desc("uint8", [200000]))) +
        op("PUT_CHUNK", put_chunk(ref(0), 0) + f_msg(5, slice_(3, 1 << 40, 65536))) +
        op("PUT_CHUNK", put_chunk(ref(0), 0) + f_msg(5, slice_(3, 1 << 40, 3 * 65536))) +
        op("PUT_CHUNK", put_chunk(ref(0), 0) + f_msg(5, slice_(3, 1 << 40, 33 << 20))) +
        # whole puts naming the caller's memory: alone (refused), and a batch's
        # elements read together (one converted, one past what a batch reads),
        # with the batch's fence
        op("PUT_BEGIN", put_begin(desc("uint8", [4096]), commit=True) +
           f_msg(14, slice_(3, 1 << 40, 4096))) +
        op("PUT_BATCH", f_msg(1, put_begin(desc("uint8", [4096]), commit=True) +
                              f_msg(14, slice_(3, 1 << 40, 4096))) +
           f_msg(1, put_begin(desc("uint8", [100]), dtype="int16", commit=True) +
                 f_msg(14, slice_(3, (1 << 40) + 8192, 100))) +
           f_msg(1, put_begin(desc("uint8", [33 << 20]), commit=True) +
                 f_msg(14, slice_(3, 1 << 41, 33 << 20))) +
           f_packed(2, [0, 0, 0]) + f_varint(3, (1 << 40) + 65536) + f_fixed64(4, 0x5eed)),
        # a put and two runs of alike elements (one with CRC32Cs, not all right),
        # then runs that cannot be: named, a slice in no region, too many
        "put_batch_runs": op("PUT_BATCH", msg + f_msg(5, put_run(desc("float32", [3]), 4, 12, crcs=[1, 2, 3, 4])) +
                             f_msg(5, put_run(desc("int16", [2, 10]), 3, 40)),
                             payload + tensor_bytes("float32", [3]) * 4 +
                             tensor_bytes("int16", [2, 10]) * 3) +
        op("PUT_BATCH", f_msg(5, put_run(desc("uint8", [8]), 2, 8, name="one"))) +
        op("PUT_BATCH", f_msg(5, put_run(desc("uint8", [8]), 2, 0, offsets=[1 << 40, 1 << 41],
                                         shm=slice_(3, 0, 8))) +
           f_varint(3, (1 << 40) + 65536) + f_fixed64(4, 0x5eed)) +
        op("PUT_BATCH", f_msg(5, put_run(desc("uint8", [0]), 5000, 0))),
        "put_batch_bad_lengths": op("PUT_BATCH", short_msg, short_payload + b"\0") +
        op("PUT_BATCH", f_msg(1, put_begin(desc("uint8", [4]))) + f_packed(2, [4]), b"abcd") +
        op("GET_BATCH", b""),
    }


def server_seeds():
    return {
        "hello_devices_stats_list": op("HELLO", hello("t1")) + op("DEVICES", b"") +
        op("STATS", b"") + op("LIST", b""),
        "put_one_get_inline": put_one("float32", [2, 3], device="sim:0") +
        op("GET_BEGIN", get_begin(ref(0), 1 << 16)) + op("INFO", only_ref(ref(0))) +
        op("FREE", only_ref(ref(0))),
        "put_chunks_get_chunks": put_multi("float32", [2500], device="sim:0") +
        op("GET_BEGIN", get_begin(ref(0), 0)) + op("GET_CHUNK", get_chunk(0, 0, 4096)) +
        op("GET_CHUNK", get_chunk(0, 4096, 4096)) + op("GET_CHUNK", get_chunk(0, 8192, 1808)),
        "put_chunks_async": put_multi("int16", [3, 2000], device="sim:1", async_chunks=True) +
        op("GET_BEGIN", get_begin(ref(0), 1 << 20)),
        "put_convert_on_commit": put_multi("uint8", [1, 3, 40, 50], device="sim:0",
                                           dtype_to="float16", fmt="channels_last") +
        op("INFO", only_ref(ref(0))),
        "to_dtype_device_format": put_one("uint8", [2, 3, 4, 5], device="cpu") +
        op("TO", to(ref(0), device="sim:1", dtype="float32", fmt="channels_last")) +
        op("TO", to(ref(1), device="sim:0", dtype="bfloat16", copy=True, non_blocking=True)) +
        op("TO", to(ref(2), exact=True, fmt="contiguous")) +
        op("GET_BEGIN", get_begin(ref(2), 1 << 20)),
        "view_copy_sync": put_one("float64", [4, 6], device="sim:0") +
        put_one("float32", [3, 2], device="sim:1") +
        op("VIEW", view(ref(0), [3, 2], [1, 6], 2)) +
        op("COPY", copy(ref(2), ref(1), non_blocking=True)) +
        op("SYNC", sync(ref(0))) + op("GET_BEGIN", get_begin(ref(0), 1 << 20)),
        "view_expand_copy": put_one("int32", [8], device="cpu") +
        op("VIEW", view(ref(0), [4, 8], [0, 1], 0)) +
        op("CONTIGUOUS", contiguous(ref(1))) + op("COPY", copy(ref(0), ref(0))),
        "contiguous_channels_last": put_one("complex64", [2, 3, 4, 2], device="sim:1") +
        op("CONTIGUOUS", contiguous(ref(0), "channels_last")) +
        op("CONTIGUOUS", contiguous(ref(1), "contiguous")),
        "put_abort": op("PUT_BEGIN", put_begin(desc("int64", [1000]), device="sim:0")) +
        op("PUT_CHUNK", put_chunk(ref(0), 0), tensor_bytes("int64", [512])) +
        op("PUT_ABORT", only_ref(ref(0))) + op("PUT_COMMIT", put_commit(ref(0))),
        "named_two_connections": op("HELLO", hello("shared")) +
        op("HELLO", hello("shared"), conn=1) +
        put_one("bool", [5, 5], name="a", keep=True) +
        op("INFO", only_ref(ref(name="a")), conn=1) +
        op("TO", to(ref(name="a"), dtype="int8", name="b"), conn=1) +
        op("LIST", b"", conn=0) + op("FREE", only_ref(ref(name="a")), conn=1),
        "racing_commits": op("PUT_BEGIN", put_begin(desc("float32", [10]), device="sim:0")) +
        op("PUT_CHUNK", put_chunk(ref(0), 0), tensor_bytes("float32", [10])) +
        op("PUT_COMMIT", put_commit(ref(0)), ctx=0, async_=True) +
        op("PUT_COMMIT", put_commit(ref(0)), ctx=1, async_=True),
        "empty_tensor": op("PUT_BEGIN", put_begin(desc("float32", [0, 3]), device="sim:0")) +
        op("PUT_COMMIT", put_commit(ref(0))) + op("GET_BEGIN", get_begin(ref(0), 0)),
        # issue 21: a wait woken by a put on another connection, a wait that
        # times out (the harness's deadline is 200 ms), a replace, many frees
        "wait_woken_by_put": op("HELLO", hello("w")) + op("HELLO", hello("w"), conn=1) +
        op("INFO", info_wait(ref(name="n"), 150), ctx=0, async_=True) +
        op("GET_BEGIN", get_begin(ref(name="n"), 1 << 16, wait_ms=150), ctx=1, async_=True) +
        put_one("float32", [4, 4], name="n", conn=1) +
        op("INFO", info_wait(ref(name="never"), 20)) +
        op("FREE", free_refs(ref(name="n"), ref(name="never"), ref(0))),
        "replace_named": put_one("int32", [16], name="r", keep=True) +
        put_one("int32", [16], name="r", replace=True) +
        put_multi("int32", [3000], name="r", slot=2, replace=True) +
        op("GET_BEGIN", get_begin(ref(name="r"), 1 << 20)) +
        op("FREE", free_refs(ref(0), ref(1), ref(2))),
        # the destination a get expects: right, then other sizes, dtype, rank
        "get_expect": put_one("bool", [2, 3], device="sim:0") +
        op("GET_BEGIN", get_begin(ref(0), 1 << 16, expect=("bool", [2, 3]))) +
        op("GET_BEGIN", get_begin(ref(0), 1 << 16, expect=("uint8", [2, 3]))) +
        op("GET_BEGIN", get_begin(ref(0), 1 << 16, expect=("uint8", [3, 2]))) +
        op("GET_BEGIN", get_begin(ref(0), 1 << 16, expect=("float32", [2, 3]))) +
        op("GET_BEGIN", get_begin(ref(0), 0, expect=("bool", [2, 3, 1]))),
        "raw_frames": raw(b"\x00" * 5) + raw(b"TPRT\x02\x00\x00\x01\x00\x00\x00\x00") +
        raw(frame("STATS", b"")) + raw(frame("LIST", b"", flags=FRAME_REPLY), conn=1) +
        raw(struct.pack(">IBBHI", 0x54505254, 1, 0, 99, 0)),
        **batch_seeds(),
    }


# ---------------------------------------------------------------- main


def write(kind, seeds):
    d = os.path.join(HERE, "corpus", kind)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    for name, data in seeds.items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
    return sum(len(v) for v in seeds.values())


def main():
    total = 0
    for kind, seeds in (("frame", frame_seeds()), ("npy", npy_seeds()),
                        ("server", server_seeds())):
        n = write(kind, seeds)
        print(f"corpus/{kind}: {len(seeds)} files, {n} bytes")
        total += n
    assert total < 1 << 20, "keep the corpus small"
    return 0


if __name__ == "__main__":
    sys.exit(main())
