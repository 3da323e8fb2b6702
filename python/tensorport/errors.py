"""errors: tensorport's exceptions, one class per status code.

Every failure of a call is a :class:`Error` carrying ``.code`` (the gRPC name
of the status, as libtport and the server number them: ``"NOT_FOUND"``,
``"INVALID_ARGUMENT"``, ...), ``.status`` (its number) and ``.message`` (the
server's own text, unchanged: where PyTorch would raise, the message is
PyTorch's).  ``str(error)`` is the message.  Each code has its own subclass,
so ``except tensorport.NotFound`` catches exactly that; ``InvalidArgument``
is also a ``ValueError`` and ``NotFound`` a ``LookupError``.
"""

__all__ = [
    "Error",
    "Cancelled",
    "Unknown",
    "InvalidArgument",
    "DeadlineExceeded",
    "NotFound",
    "AlreadyExists",
    "PermissionDenied",
    "ResourceExhausted",
    "FailedPrecondition",
    "Aborted",
    "OutOfRange",
    "Unimplemented",
    "Internal",
    "Unavailable",
    "DataLoss",
    "Unauthenticated",
    "CODES",
]

#: status number -> gRPC name (include/tport_types.h's tport_status)
CODES = {
    1: "CANCELLED",
    2: "UNKNOWN",
    3: "INVALID_ARGUMENT",
    4: "DEADLINE_EXCEEDED",
    5: "NOT_FOUND",
    6: "ALREADY_EXISTS",
    7: "PERMISSION_DENIED",
    8: "RESOURCE_EXHAUSTED",
    9: "FAILED_PRECONDITION",
    10: "ABORTED",
    11: "OUT_OF_RANGE",
    12: "UNIMPLEMENTED",
    13: "INTERNAL",
    14: "UNAVAILABLE",
    15: "DATA_LOSS",
    16: "UNAUTHENTICATED",
}


class Error(Exception):
    """A tensorport call failed: ``.code`` (gRPC name), ``.status`` (number), ``.message``.

    Raised as the subclass for its code; ``Error`` itself only for a code
    this package does not know.
    """

    code = "UNKNOWN"
    status = 2

    def __init__(self, message, code=None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
            self.status = next((n for n, c in CODES.items() if c == code), 2)

    def __str__(self):
        return self.message

    def __repr__(self):
        return "%s(%r, code=%r)" % (type(self).__name__, self.message, self.code)

    def __reduce__(self):
        return (error_for, (self.status, self.message))


def _make(name, number, doc, *bases):
    cls = type(name, (Error,) + bases, {"__doc__": doc, "code": CODES[number], "status": number})
    cls.__module__ = __name__
    return cls


Cancelled = _make("Cancelled", 1, "CANCELLED: the operation was cancelled.")
Unknown = _make("Unknown", 2, "UNKNOWN: an error the server could not classify.")
InvalidArgument = _make(
    "InvalidArgument",
    3,
    "INVALID_ARGUMENT: a bad dtype, shape, stride, device, format or option; "
    "PyTorch's own errors (copy_ overlap, broadcasting) come as this.  Also a ValueError.",
    ValueError,
)
DeadlineExceeded = _make(
    "DeadlineExceeded", 4, "DEADLINE_EXCEEDED: the request ran past the server's --deadline."
)
NotFound = _make(
    "NotFound",
    5,
    "NOT_FOUND: no tensor with that handle or name for this tenant (freed, expired, "
    "gone with its connection, or another tenant's).  Also a LookupError.",
    LookupError,
)
AlreadyExists = _make("AlreadyExists", 6, "ALREADY_EXISTS: a tensor of that name exists.")
PermissionDenied = _make("PermissionDenied", 7, "PERMISSION_DENIED: not allowed to this tenant.")
ResourceExhausted = _make(
    "ResourceExhausted",
    8,
    "RESOURCE_EXHAUSTED: a limit (bytes per tensor, the tenant's quota, tensors per "
    "tenant, transfers in flight) or device memory ran out.",
)
FailedPrecondition = _make(
    "FailedPrecondition", 9, "FAILED_PRECONDITION: not possible in this state (a closed client)."
)
Aborted = _make("Aborted", 10, "ABORTED: the connection is closing.")
OutOfRange = _make("OutOfRange", 11, "OUT_OF_RANGE: a value past what is allowed.")
Unimplemented = _make("Unimplemented", 12, "UNIMPLEMENTED: not supported by this server.")
Internal = _make("Internal", 13, "INTERNAL: a bug in tensorport.")
Unavailable = _make(
    "Unavailable", 14, "UNAVAILABLE: cannot reach the server, or the connection broke."
)
DataLoss = _make("DataLoss", 15, "DATA_LOSS: bytes damaged in transit (with verify=True).")
Unauthenticated = _make(
    "Unauthenticated",
    16,
    "UNAUTHENTICATED: the server wants proof of the tenant (secret_file=, secret= or a "
    "client certificate), or the proof was wrong.",
)

_BY_STATUS = {cls.status: cls for cls in Error.__subclasses__()}


def error_for(status, message):
    """The exception for a status number and message (an :class:`Error` subclass)."""
    cls = _BY_STATUS.get(status)
    if cls is None:
        return Error(message, code=CODES.get(status, "UNKNOWN"))
    return cls(message)
