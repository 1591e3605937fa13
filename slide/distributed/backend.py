"""The in-process backend: the shards are ``OutputShard`` objects of this process, called one
after the other. Same interface as ``slide.distributed.ray_backend.RayBackend``; for tests,
debugging and one-machine runs without Ray. ``SimulatedLatency`` wraps either backend with a
network's latency, so that its cost can be measured on one machine."""
import time

from slide.distributed.shard import OutputShard


class LocalBackend:
    """``create(specs)`` builds one shard per spec (``OutputShard`` keywords) or restores it
    from a state dict; ``call_each(method, args_list)`` calls shard q's ``method`` with
    ``args_list[q]``; ``call_all(method, *args)`` calls every shard with the same arguments.
    Both return the results in shard order."""

    name = "local"

    def __init__(self):
        self.shards = []

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

    def shutdown(self):
        self.shards = []


class SimulatedLatency:
    """``backend`` with every message delayed by ``latency_ms`` milliseconds each way: a call
    to the shards (``call_each``, ``call_all``: one message to each shard, in parallel) waits
    that long before it is sent and after the last reply arrives, as a network between the
    driver and the shards would add. Every other method is the backend's. The protocol is
    synchronous (each call waits for its replies), so the two waits are what a network of that
    latency costs a call; a pipelined protocol would need the delays per message instead."""

    def __init__(self, backend, latency_ms):
        self.inner = backend
        self.delay_s = float(latency_ms) / 1000.0

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

    def __getattr__(self, name):
        return getattr(self.inner, name)
