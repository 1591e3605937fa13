"""The in-process backend: the shards are ``OutputShard`` objects of this process, called one
after the other. Same interface as ``slide.distributed.ray_backend.RayBackend``; for tests,
debugging and one-machine runs without Ray. ``SimulatedLatency`` wraps either backend with a
network's latency, so that its cost can be measured on one machine.

Both backends answer two kinds of calls: ``call_each`` / ``call_all`` wait for the shards'
results; ``submit_each`` sends a message to every shard and returns at once, and
``wait(handle)`` gives its results and when the last shard finished (``time.monotonic()``,
one clock for every process of a machine): the pipelined protocol
(``slide.distributed.pipeline``) keeps several such messages in flight. A backend runs one
shard's messages in the order they were sent.
"""
import time
from concurrent.futures import ThreadPoolExecutor

from slide.distributed.shard import OutputShard


class LocalBackend:
    """``create(specs)`` builds one shard per spec (``OutputShard`` keywords) or restores it
    from a state dict; ``call_each(method, args_list)`` calls shard q's ``method`` with
    ``args_list[q]``; ``call_all(method, *args)`` calls every shard with the same arguments.
    Both return the results in shard order."""

    name = "local"

    def __init__(self):
        self.shards = []
        self._runner = None         # the thread that runs submitted messages, in order

    def create(self, specs, files=None):
        """One shard per spec (``OutputShard`` keywords), or, with ``files``, each restored
        from its checkpoint file."""
        if files is not None:
            self.shards = [OutputShard.from_file(f) for f in files]
        else:
            self.shards = [OutputShard(**sp) for sp in specs]
        return self

    def reload(self, files):
        """Replace every shard by the one saved in its file (a rollback to a checkpoint)."""
        self.shards = [OutputShard.from_file(f) for f in files]

    @property
    def n_shards(self):
        return len(self.shards)

    def call_each(self, method, args_list):
        return [getattr(sh, method)(*args) for sh, args in zip(self.shards, args_list)]

    def call_all(self, method, *args):
        return [getattr(sh, method)(*args) for sh in self.shards]

    def _run_each(self, method, args_list):
        out = self.call_each(method, args_list)
        return out, time.monotonic()

    def submit_each(self, method, args_list):
        """``call_each`` on a thread of its own (the shards' kernels release the GIL: they run
        beside the driver's); ``wait`` gives its results."""
        if self._runner is None:
            self._runner = ThreadPoolExecutor(1, thread_name_prefix="slide-shards")
        return self._runner.submit(self._run_each, method, args_list)

    def wait(self, handle):
        """(results in shard order, time the last shard finished) of a ``submit_each``."""
        return handle.result()

    def compile_graph(self, method, max_in_flight):
        """Nothing to compile in process (``RayBackend.compile_graph``)."""

    def close_graphs(self):
        pass

    def shutdown(self):
        if self._runner is not None:
            self._runner.shutdown(wait=True)
            self._runner = None
        self.shards = []


class SimulatedLatency:
    """``backend`` with every message delayed by ``latency_ms`` milliseconds each way, as a
    network between the driver and the shards would add. A waited call (``call_each``,
    ``call_all``: one message to each shard, in parallel) waits that long before it is sent
    and after the last reply arrives. A submitted message (``submit_each``) is handed to the
    shards that long after it was sent, by a courier thread that keeps the messages' order,
    and its replies are ready that long after the last shard finished: messages in flight
    overlap their delays, as on a network. Every other method is the backend's."""

    def __init__(self, backend, latency_ms):
        self.inner = backend
        self.delay_s = float(latency_ms) / 1000.0
        self._courier = None

    def create(self, specs, files=None):
        self.inner.create(specs, files)
        return self

    def _delayed(self, call, *args):
        time.sleep(self.delay_s)
        out = call(*args)
        time.sleep(self.delay_s)
        return out

    def call_each(self, method, args_list):
        return self._delayed(self.inner.call_each, method, args_list)

    def call_all(self, method, *args):
        return self._delayed(self.inner.call_all, method, *args)

    def _deliver(self, due, method, args_list):
        time.sleep(max(0.0, due - time.monotonic()))
        return self.inner.submit_each(method, args_list)

    def submit_each(self, method, args_list):
        if self._courier is None:
            self._courier = ThreadPoolExecutor(1, thread_name_prefix="slide-latency")
        return self._courier.submit(self._deliver, time.monotonic() + self.delay_s, method,
                                    args_list)

    def wait(self, handle):
        results, done = self.inner.wait(handle.result())
        arrived = done + self.delay_s
        time.sleep(max(0.0, arrived - time.monotonic()))
        return results, arrived

    def shutdown(self):
        if self._courier is not None:
            self._courier.shutdown(wait=True)
            self._courier = None
        self.inner.shutdown()

    def __getattr__(self, name):
        return getattr(self.inner, name)
