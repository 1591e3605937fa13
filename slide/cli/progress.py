"""Signals (finish the batch, checkpoint, exit 130 / 143) and progress output of
``slide train``."""
from __future__ import annotations

import signal
import sys
import time

from slide.cli.common import EXIT_SIGINT, EXIT_SIGTERM, Stopped, _err, _fmt_seconds, _info


# ---------------------------------------------------------------------------------------------
# signals: finish the current batch, checkpoint, exit 130 / 143

class StopFlag:
    """Installed for the duration of ``slide train``. The first SIGINT/SIGTERM only sets a flag
    that the per-batch callback reads (a batch is one Numba call, so a Python handler cannot run
    inside it anyway); a second SIGINT aborts at once without a new checkpoint."""

    def __init__(self):
        self.signum = None
        self._old = {}
        # before training starts there is nothing to checkpoint: stop at once (reading or
        # generating a large data set can take minutes)
        self.immediate = True

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._old[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread (e.g. called from a test thread)
                pass
        return self

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)
        return False

    def _handle(self, signum, frame):
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signum = signum
        if self.immediate:
            raise Stopped(f"stopped by {self.name} before training started; nothing trained, "
                          f"no checkpoint written", self.code)
        name = "Ctrl-C" if signum == signal.SIGINT else "SIGTERM"
        _err(f"\n{name} received: finishing the current batch and writing a checkpoint "
             f"(press Ctrl-C again to abort without one)")

    @property
    def code(self):
        return EXIT_SIGINT if self.signum == signal.SIGINT else EXIT_SIGTERM

    @property
    def name(self):
        return "Ctrl-C (SIGINT)" if self.signum == signal.SIGINT else "SIGTERM"


# ---------------------------------------------------------------------------------------------
# progress output

class Progress:
    """tqdm bar when stdout is a terminal, plain log lines every ``every`` seconds otherwise."""

    def __init__(self, label, total, initial, every, samples0=0):
        self.label = label
        self.total = total
        self.every = every
        self.last_log = time.monotonic()
        self.p1 = None
        self.bar = None
        self.samples0 = samples0
        if sys.stdout.isatty():
            try:
                from tqdm import tqdm
                self.bar = tqdm(total=total, initial=initial, unit="batch", desc=label,
                                dynamic_ncols=True, leave=True, file=sys.stdout,
                                mininterval=0.2)
            except ImportError:
                self.bar = None

    def update(self, batch, epoch, loss, train_seconds, samples, force=False):
        rate = samples / train_seconds if train_seconds > 0 else 0.0
        p1 = "-" if self.p1 is None else f"{self.p1:.4f}"
        if self.bar is not None:
            # tqdm redraws at most every mininterval, so a batch of a few hundred microseconds
            # does not pay for terminal output
            self.bar.set_postfix_str(f"epoch {epoch} loss {loss:.4f} P@1 {p1} "
                                     f"{rate:,.0f} samples/s", refresh=False)
            self.bar.update(batch - self.bar.n)
            return
        now = time.monotonic()
        if force or now - self.last_log >= self.every:
            self.last_log = now
            pct = f"{100.0 * batch / self.total:5.1f}%" if self.total else ""
            _info(f"[{self.label}] batch {batch}/{self.total} {pct} epoch {epoch} "
                  f"loss {loss:.4f} P@1 {p1} {rate:,.0f} samples/s "
                  f"train {_fmt_seconds(train_seconds)}")

    def write(self, msg):
        if self.bar is not None:
            self.bar.write(msg)
        else:
            _info(msg)

    def close(self):
        if self.bar is not None:
            self.bar.close()
            self.bar = None
