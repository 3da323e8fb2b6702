"""_devices: the server's devices as ``Client.devices()`` returns them."""
import dataclasses
from typing import Optional, Tuple

from ._convert import _s

__all__ = ["DeviceInfo", "DeviceList"]


@dataclasses.dataclass(frozen=True)
class DeviceInfo:
    """A device of the server (``Client.devices()``): ``device`` ("cpu", "sim:0",
    "cuda:0"), its ``name``, memory (``total_bytes``, ``free_bytes``; free is
    shown to operators only: None to other tenants), ``compute_capability``
    (CUDA), the devices it has peer access to, and whether it offers managed
    memory."""

    device: str
    name: str
    total_bytes: int
    free_bytes: Optional[int]
    compute_capability: str
    peers: Tuple[str, ...]
    managed_memory: bool


class DeviceList(list):
    """A list of :class:`DeviceInfo`, with ``cuda_unavailable_reason``: why the server
    has no CUDA devices ("" when it has them, or was not asked to serve them)."""

    cuda_unavailable_reason = ""


def devices_from_c(p, n, why):
    """The DeviceList of tport_devices' array p[0..n) and its reason text."""
    out = DeviceList()
    for i in range(n):
        d = p[i]
        out.append(DeviceInfo(
            device=_s(d.device), name=_s(d.name), total_bytes=d.total_bytes,
            free_bytes=None if d.free_hidden else d.free_bytes,
            compute_capability=_s(d.compute_capability),
            peers=tuple(_s(d.peers[k].value) for k in range(min(d.npeers, 16))),
            managed_memory=bool(d.managed_memory)))
    out.cuda_unavailable_reason = _s(why)
    return out
