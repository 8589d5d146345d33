"""A progress bar on stderr, only when stderr is a terminal: tqdm's (rate and ETA) where it is installed
(`pip install 'dlnet[progress]'`), else a one-line bar that shows the same count, rate and ETA."""
import os
import sys
import time

import click


def isatty(stream):
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _size(stream):
    try:
        return tuple(os.get_terminal_size(stream.fileno()))
    except (AttributeError, ValueError, OSError):
        return 0, 0


class Progress:
    """Counts items done out of `total`; `note(line)` prints a line on stderr without tearing the bar."""

    def __init__(self, total, unit="image"):
        self.total, self.done, self.unit = total, 0, unit
        self.on = total > 1 and isatty(sys.stderr)
        self.start = time.perf_counter()
        self.bar = None
        if self.on:
            try:
                from tqdm import tqdm
            except ImportError:
                tqdm = None
            if tqdm is not None:
                # a terminal that reports no size (a new pseudo-terminal) gets 80 x 24: tqdm hides a bar on row 0
                # of a terminal it thinks has no rows
                columns, lines = _size(sys.stderr)
                self.bar = tqdm(total=total, unit=unit, file=sys.stderr, leave=False, dynamic_ncols=columns > 0,
                                ncols=None if columns > 0 else 80, nrows=None if lines > 0 else 24)

    def step(self, n=1):
        self.done += n
        if not self.on:
            return
        if self.bar is not None:
            self.bar.update(n)
            return
        elapsed = time.perf_counter() - self.start
        rate = self.done / elapsed if elapsed > 0 else 0.0
        eta = f"{(self.total - self.done) / rate:.0f} s" if rate > 0 else "?"
        filled = 30 * self.done // max(self.total, 1)
        sys.stderr.write(f"\r[{'#' * filled}{'.' * (30 - filled)}] {self.done}/{self.total} {rate:.1f} "
                         f"{self.unit}s/s ETA {eta}\033[K")
        sys.stderr.flush()

    def clear(self):
        """Take the bar off the line (it comes back at the next step)."""
        if not self.on:
            return
        if self.bar is not None:
            self.bar.clear()
        else:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()

    def note(self, line):
        self.clear()
        click.echo(line, err=True)
        if self.bar is not None:
            self.bar.refresh()

    def close(self):
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        else:
            self.clear()
        self.on = False
