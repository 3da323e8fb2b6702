"""units: sizes and durations as people type them, parsed by libtport.

``parse_size("1.5G")``, ``parse_duration("10m")``: the grammar of tport's and
tportd's flags (``tport_parse_size``, ``tport_parse_duration_ms``), so that a
string means here what it means on their command lines.  Client arguments
that take a duration (``ttl=``, ``timeout=``) accept such a string as well as
a number of seconds or a ``datetime.timedelta``.
"""
import ctypes
import datetime

from . import _lib
from .errors import InvalidArgument, error_for

__all__ = ["parse_size", "parse_duration"]


def _fail(rc, err):
    raise error_for(rc, err.msg.decode("utf-8", "replace"))


def parse_size(text, what="size"):
    """Bytes from "4096", "64GiB", "1.5G", "512M", "2KB" (K M G T and KiB...:
    1024s; KB MB GB TB: 1000s).  Raises InvalidArgument naming ``what`` and
    the accepted forms for a negative, junk or a fraction of a byte."""
    out, err = ctypes.c_uint64(), _lib.Err()
    rc = _lib.load().tport_parse_size(str(text).encode(), what.encode(), ctypes.byref(out),
                                      ctypes.byref(err))
    if rc:
        _fail(rc, err)
    return out.value


def parse_duration(text, what="duration"):
    """Seconds (a float) from "500ms", "30s", "10m", "1.5h", "2d"; a bare
    number is seconds.  Raises InvalidArgument naming ``what`` otherwise."""
    return _duration_ms(text, what) / 1000.0


def _duration_ms(value, what):
    """Milliseconds from seconds (a number), a timedelta or a string."""
    if isinstance(value, str):
        out, err = ctypes.c_uint64(), _lib.Err()
        rc = _lib.load().tport_parse_duration_ms(value.encode(), what.encode(), True,
                                                 ctypes.byref(out), ctypes.byref(err))
        if rc:
            _fail(rc, err)
        return out.value
    if isinstance(value, datetime.timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgument("%s is %r: give seconds (a number), a timedelta or a string such "
                              "as '30s', '10m', '1.5h'" % (what, value))
    if not value >= 0:  # NaN too
        raise InvalidArgument("%s is %r seconds: it must not be negative" % (what, value))
    if value * 1000 >= 2.0 ** 64:
        raise InvalidArgument("%s is %r seconds: out of range" % (what, value))
    return int(round(value * 1000))
