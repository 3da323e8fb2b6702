"""_progress: a ``progress=`` argument as libtport's progress callback."""
from . import _lib
from .errors import InvalidArgument


class Progress:
    """A progress= argument made into a tport_progress_fn: a callable(done, total), or True
    for a tqdm bar (when tqdm is installed), or None.  An exception raised by the
    callable is kept and raised once the transfer has ended."""

    def __init__(self, progress, desc):
        self.fn = None
        self.bar = None
        self.exc = None
        self.last = 0
        self.desc = desc
        if progress is True:
            try:
                import tqdm

                self.tqdm = tqdm.tqdm
                self.fn = self._bar
            except ImportError:
                pass
        elif progress is not None and progress is not False:
            if not callable(progress):
                raise InvalidArgument("progress is %r: a callable(done, total) or True"
                                      % (progress,))
            self.fn = progress
        self.cfunc = _lib.PROGRESS_FN(self._call) if self.fn else _lib.PROGRESS_FN()

    def _bar(self, done, total):
        if self.bar is None:
            self.bar = self.tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024,
                                 desc=self.desc, leave=False)
        self.bar.update(done - self.last)
        self.last = done

    def _call(self, arg, done, total):
        if self.exc is not None:
            return
        try:
            self.fn(done, total)
        except BaseException as e:  # noqa: B902 -- kept and raised after the C call
            self.exc = e

    def close(self):
        """Closes the bar (a transfer that failed: its own error is the one to raise)."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def finish(self):
        """Closes the bar; raises what the callable raised."""
        self.close()
        if self.exc is not None:
            e, self.exc = self.exc, None
            raise e
