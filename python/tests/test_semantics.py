"""to(), contiguous() and copy_() against PyTorch's own answers on the same inputs.

Each input is rebuilt on the server exactly (its storage put as 1-D, then viewed
with the torch tensor's sizes, strides and storage offset), and each operation
runs in torch and in tensorport: aliasing must agree (``r is v`` in torch is
``R is T`` and ``R.ref == T.ref`` here), so must the result's strides, dtype
and values, and where torch raises, tensorport raises its message unchanged.
"""
import pytest

import tensorport as tp
from conftest import torch_or_skip

torch = torch_or_skip()

CL, CL3 = torch.channels_last, torch.channels_last_3d
CASES = {
    "contiguous": lambda: torch.randn(2, 3, 4, 5),
    "channels_last": lambda: torch.randn(2, 3, 4, 5).contiguous(memory_format=CL),
    "n1hw_contiguous": lambda: torch.randn(32).as_strided((2, 1, 4, 4), (16, 16, 4, 1)),
    "n1hw_channels_last": lambda: torch.randn(32).as_strided((2, 1, 4, 4), (16, 1, 4, 1)),
    "n111": lambda: torch.randn(4, 1, 1, 1),
    "transposed": lambda: torch.randn(3, 4).t(),
    "expanded": lambda: torch.ones(3, 1).expand(3, 4),
    "expanded_4d": lambda: torch.randn(2, 3, 1, 5).expand(2, 3, 4, 5),
    "channels_last_3d": lambda: torch.randn(2, 3, 2, 4, 5).contiguous(memory_format=CL3),
    "contiguous_5d": lambda: torch.randn(2, 3, 2, 4, 5),
    "permuted_4d": lambda: torch.randn(2, 3, 4, 5).permute(0, 2, 3, 1),
    "stepped": lambda: torch.randn(4, 6)[:, ::2],
    "offset": lambda: torch.randn(5, 4)[1:],
    "offset_4d": lambda: torch.randn(3, 3, 4, 5)[1:, :, 1:],
    "zero_dim": lambda: torch.randn(()),
    "vector": lambda: torch.randn(7),
    "empty": lambda: torch.randn(0, 3),
    "empty_4d": lambda: torch.randn(2, 0, 4, 5),
}

OPS = {
    # name: (torch, tensorport, applies to (None: any rank, else the rank))
    "to_same_dtype": (lambda v: v.to(v.dtype), lambda t: t.to(dtype=t.dtype), None),
    "to_float64": (lambda v: v.to(torch.float64), lambda t: t.to(dtype="float64"), None),
    "to_positional_dtype": (lambda v: v.to(torch.float16), lambda t: t.to(torch.float16), None),
    "to_copy": (lambda v: v.to(copy=True), lambda t: t.to(copy=True), None),
    "to_same_device": (lambda v: v.to("cpu"), lambda t: t.to(device=t.device), None),
    "to_same_device_non_blocking": (lambda v: v.to("cpu", non_blocking=True),
                                    lambda t: t.to(device=t.device, non_blocking=True), None),
    "to_contiguous": (lambda v: v.to(memory_format=torch.contiguous_format),
                      lambda t: t.to(memory_format="contiguous"), None),
    "to_preserve": (lambda v: v.to(memory_format=torch.preserve_format),
                    lambda t: t.to(memory_format=torch.preserve_format), None),
    "to_channels_last": (lambda v: v.to(memory_format=CL),
                         lambda t: t.to(memory_format="channels_last"), None),
    "to_channels_last_3d": (lambda v: v.to(memory_format=CL3),
                            lambda t: t.to(memory_format="channels_last_3d"), 5),
    "to_float64_channels_last": (lambda v: v.to(torch.float64, memory_format=CL),
                                 lambda t: t.to(dtype="float64", memory_format=CL), 4),
    "contiguous": (lambda v: v.contiguous(), lambda t: t.contiguous(), None),
    "contiguous_channels_last": (lambda v: v.contiguous(memory_format=CL),
                                 lambda t: t.contiguous("channels_last"), None),
    "contiguous_channels_last_3d": (lambda v: v.contiguous(memory_format=CL3),
                                    lambda t: t.contiguous(CL3), 5),
    "contiguous_preserve": (lambda v: v.contiguous(memory_format=torch.preserve_format),
                            lambda t: t.contiguous("preserve"), None),
}

DEVICES = ["cpu", "sim:0"]


def on_server(client, v, device):
    """v rebuilt on the server: its whole storage put as 1-D, then v's view of it."""
    base = torch.empty(0, dtype=v.dtype).set_(v.storage())
    return client.put(base, device=device).view(tuple(v.shape), v.stride(), v.storage_offset())


RANK = {c: f().dim() for c, f in CASES.items()}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case,op", [(c, o) for c in sorted(CASES) for o in sorted(OPS)
                                     if OPS[o][2] in (None, RANK[c])])
def test_aliasing_and_strides_like_torch(client, case, op, device):
    torch_op, tp_op, rank = OPS[op]
    torch.manual_seed(len(case))
    v = CASES[case]()
    T = on_server(client, v, device)
    assert T.shape == tuple(v.shape) and T.strides == v.stride()
    assert T.is_contiguous() == v.is_contiguous()
    for f in (torch.contiguous_format, CL, CL3):
        assert T.is_contiguous(memory_format=f) == v.is_contiguous(memory_format=f), f
    assert T.size() == tuple(v.size()) and T.stride() == v.stride() and T.dim() == v.dim()
    assert all(T.size(d) == v.size(d) and T.stride(d) == v.stride(d)
               for d in range(-v.dim(), v.dim()))
    try:
        r = torch_op(v)
    except RuntimeError as e:
        with pytest.raises(tp.Error) as got:
            tp_op(T)
        assert str(got.value) == str(e)
        assert isinstance(got.value, tp.InvalidArgument)
        return
    R = tp_op(T)
    assert (R is T) == (r is v), "aliasing differs from torch"
    assert (R.ref == T.ref) == (r is v)
    assert R.shape == tuple(r.shape) and R.strides == r.stride()
    assert R.dtype == str(r.dtype)[6:]
    assert R.device == device
    if r is v:
        assert R.storage_offset == T.storage_offset
    assert torch.equal(R.torch(), r)


@pytest.mark.parametrize("case,fmt", [(c, f) for c in sorted(CASES) for f, r in
                                      (("contiguous", RANK[c]), ("channels_last", 4),
                                       ("channels_last_3d", 5)) if r == RANK[c]])
def test_exact_format_aliases_iff_contiguous_in_that_format(client, case, fmt):
    v = CASES[case]()
    tf = {"contiguous": torch.contiguous_format, "channels_last": CL,
          "channels_last_3d": CL3}[fmt]
    T = on_server(client, v, "sim:1")
    R = T.to(memory_format=fmt, exact_format=True)
    assert (R is T) == v.is_contiguous(memory_format=tf)
    assert R.is_contiguous() or fmt != "contiguous"
    assert torch.equal(R.torch(), v)
    want = "none" if not any(v.is_contiguous(memory_format=f)
                             for f in (torch.contiguous_format, CL, CL3)) else None
    if want:
        assert T.memory_format == "none"


def test_named_alias_is_a_new_tensor_on_the_same_storage(client):
    T = client.put(torch.randn(3, 4), device="sim:0")
    R = T.to(dtype="float32", name="alias-%s" % T.ref)
    assert R is not T and R.ref != T.ref and R.name == "alias-%s" % T.ref
    R.copy_(torch.zeros(3, 4))  # the same storage: T sees it
    assert torch.equal(T.torch(), torch.zeros(3, 4))
    R.free()


def test_to_other_device_copies(client):
    v = torch.randn(2, 3, 4, 5).contiguous(memory_format=CL)
    T = on_server(client, v, "sim:0")
    for dev in ("sim:1", "cpu"):
        R = T.to(device=dev)
        assert R is not T and R.device == dev and R.strides == v.stride()
        assert torch.equal(R.torch(), v)


def copy_cases():
    """(name, dst builder, src builder) over one shared storage 'b' (arange(24.))."""
    return {
        "internal_overlap": (lambda b: b[:1].as_strided((3,), (0,)), lambda b: b[4:7]),
        "partial_overlap": (lambda b: b[0:5], lambda b: b[2:7]),
        "full_overlap": (lambda b: b[0:5], lambda b: b[0:5]),
        "broadcast_mismatch": (lambda b: b[:6].view(2, 3), lambda b: b[10:14]),
        "broadcast_extra_dims": (lambda b: b[:3], lambda b: b[10:16].view(2, 3)),
        "broadcast_row": (lambda b: b[:12].view(3, 4).t(), lambda b: b[20:23]),
        "strided_dst": (lambda b: b[:12].view(3, 4)[:, ::2], lambda b: b[14:20].view(3, 2)),
    }


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", sorted(copy_cases()))
def test_copy_like_torch(client, case, device):
    dst_of, src_of = copy_cases()[case]
    b = torch.arange(24.0)
    B = client.put(b.clone(), device=device)

    def view(x):
        return B.view(tuple(x.shape), x.stride(), x.storage_offset())

    d, s = dst_of(b), src_of(b)
    D, S = view(d), view(s)
    try:
        d.copy_(s)
    except RuntimeError as e:
        with pytest.raises(tp.InvalidArgument) as got:
            D.copy_(S)
        assert str(got.value) == str(e)
        return
    assert D.copy_(S) is D
    assert torch.equal(B.torch(), b)


def test_copy_converts_and_broadcasts_from_host_data(client):
    D = client.put(torch.zeros(2, 3, dtype=torch.float64), device="sim:1")
    D.copy_(torch.tensor([1, 2, 3], dtype=torch.int32))
    assert torch.equal(D.torch(), torch.tensor([[1.0, 2, 3], [1, 2, 3]], dtype=torch.float64))
    before = len(client.list())
    import numpy as np

    D.copy_(np.array([[7.5], [8.5]], dtype=np.float32), non_blocking=True)
    D.sync()
    assert torch.equal(D.torch(), torch.tensor([[7.5] * 3, [8.5] * 3], dtype=torch.float64))
    assert len(client.list()) == before  # the temporary source went


def test_conversions_match_torch_values(client):
    x = torch.tensor([-1.5, 0.0, 2.7, 300.0, -129.5, float("inf")], dtype=torch.float32)
    T = client.put(x)
    for name in ("uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "bool",
                 "complex64"):
        want = x.to(getattr(torch, name))
        assert torch.equal(T.to(dtype=name).torch(), want), name
