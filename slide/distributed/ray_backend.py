"""The Ray backend: one actor per shard (``ShardActor``, a process holding one
``OutputShard``), restarted by Ray when it dies (``max_restarts``); the driver then rolls every
shard and itself back to the last checkpoint (``ShardedSlideClassifier``).

``ray.init`` is called only when Ray is not initialised yet: ``address=None`` starts a local
Ray (``num_cpus`` = the machine's), "auto" / "host:port" join a running cluster, which must
answer within ``CONNECT_TIMEOUT_S`` or a ``ConnectionError`` names the address.
"""
import os
import socket
import time
from collections import deque
from typing import NamedTuple

import numba
import numpy as np
from threadpoolctl import threadpool_limits

from slide.distributed.shard import OutputShard


CONNECT_TIMEOUT_S = 10.0
RESTART_TIMEOUT_S = 120.0
FREE_CPU_WAIT_S = 20.0
GRAPH_TIMEOUT_S = 600.0
NAP_SHARE = 0.75


LOCAL_MODELS = 4      # sharded models a local Ray started by slide has CPU tokens for


class ShardFailure(RuntimeError):
    """A shard actor died during a call (Ray restarts it; its state is lost)."""


class ShardRestartedError(RuntimeError):
    """Raised inside an actor that Ray restarted and that was not reloaded since: its shard is
    the one its constructor built (initial weights), not the one the driver trained."""


def _import_ray():
    try:
        import ray
    except ImportError:  # pragma: no cover - ray is in the test extra
        raise ImportError("backend='ray' needs Ray: pip install -e '.[distributed]' (or use "
                          "backend='local')") from None
    return ray


def _check_address(address):
    """Fail fast (ConnectionError naming it) when a 'host:port' address does not answer."""
    if address in (None, "auto", "local") or address.startswith("ray://"):
        return
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S):
            pass
    except (OSError, ValueError) as exc:
        raise ConnectionError(f"ray_address {address!r}: the Ray cluster does not answer "
                              f"({exc})") from None


def ensure_ray(address, num_cpus=None):
    """Initialise Ray unless it already is; ConnectionError when ``address`` cannot be reached."""
    ray = _import_ray()
    _check_address(address)
    if ray.is_initialized():
        return ray
    kw = dict(ignore_reinit_error=True, include_dashboard=False, log_to_driver=False)
    if address is None:
        # a local Ray's CPUs are scheduling tokens: LOCAL_MODELS models' worth by default
        kw["num_cpus"] = num_cpus or LOCAL_MODELS * (os.cpu_count() or 1)
    try:
        ray.init(address=address, **kw)
    except ConnectionError as exc:
        raise ConnectionError(f"ray_address {address!r}: cannot connect to the Ray cluster "
                              f"({exc})") from None
    return ray


class _ShardActorImpl:
    """The actor's body: an ``OutputShard`` and a generic method call."""

    def __init__(self, spec, file, memory_cap, n_threads):
        if memory_cap:
            # RLIMIT_DATA (heap and private anonymous mappings: NumPy's arrays), not RLIMIT_AS:
            # a Ray worker maps the shared object store, gigabytes of address space it does
            # not own
            import resource
            resource.setrlimit(resource.RLIMIT_DATA, (int(memory_cap), int(memory_cap)))
        if n_threads:
            numba.set_num_threads(min(int(n_threads), numba.config.NUMBA_NUM_THREADS))
            # the shard's products on its own threads only: a BLAS pool the size of the
            # machine in every actor would spin against the other actors and the driver
            threadpool_limits(int(n_threads), user_api="blas")
        import ray

        # a restart between two calls would otherwise answer them from the constructor's
        # shard silently; every call refuses until the driver reloads a checkpoint
        self.restarted = bool(ray.get_runtime_context().was_current_actor_reconstructed)
        self.shard = OutputShard.from_file(file) if file else OutputShard(**spec)

    def call(self, method, *args):
        if self.restarted:
            raise ShardRestartedError("the shard actor was restarted since the last call")
        return getattr(self.shard, method)(*args)

    def timed_call(self, method, args):
        """``call(method, *args)``, and when it finished (``time.monotonic()``: the machine's
        clock, the same in every process; the simulated latency reads it)."""
        out = self.call(method, *args)
        return out, time.monotonic()

    def reload(self, file):
        self.shard = OutputShard.from_file(file)
        self.restarted = False
        return True

    def pid(self):
        return os.getpid()

    def memory(self):
        """This process's peak resident memory, peak virtual memory and data segment (heap +
        private mappings, what ``memory_cap`` limits) in bytes (Linux /proc)."""
        import resource
        out = {"peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
        try:
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith("VmPeak:"):
                        out["peak_vm"] = int(line.split()[1]) * 1024
                    elif line.startswith("VmData:"):
                        out["data"] = int(line.split()[1]) * 1024
        except OSError:  # pragma: no cover - not Linux
            pass
        return out


class Sent(NamedTuple):
    """A message ``submit_each`` sent, until ``wait`` reads its replies."""
    compiled: bool           # through the compiled graph (refs: CompiledDAGRefs)
    refs: list               # one per shard
    sent: float              # time.monotonic() when it left


def _copied(result):
    """``result`` with its arrays (also inside a tuple) copied."""
    if isinstance(result, tuple):
        return tuple(_copied(r) for r in result)
    return result.copy() if hasattr(result, "copy") and hasattr(result, "nbytes") else result


class RayBackend:
    """Same interface as ``slide.distributed.backend.LocalBackend``, one Ray actor per shard."""

    name = "ray"

    def __init__(self, address=None, shard_cpus=1, memory_cap=None, n_threads=None):
        self.address = address
        self.ray = None
        self.shard_cpus = int(shard_cpus)
        self.memory_cap = memory_cap
        self.n_threads = n_threads if n_threads is not None else shard_cpus
        self.actors = []
        self._graphs = {}          # method -> its compiled graph (``compile_graph``)
        self._graph_room = {}      # method -> the executions its graph keeps in flight
        self._turnarounds = deque(maxlen=16)   # seconds from a message to its last reply

    def create(self, specs, files=None):
        # a local Ray gets enough logical CPUs for every shard (they share the cores)
        need = len(specs) * self.shard_cpus
        # a local Ray's CPUs are scheduling tokens for actors that share this machine's cores
        # anyway: room for a few sharded models at once (a model and the one slide.load reads
        # back beside it), threads per actor set by n_threads
        self.ray = ray = ensure_ray(self.address, LOCAL_MODELS * max(os.cpu_count() or 1, need))
        have = ray.cluster_resources().get("CPU", 0)
        if have < need:
            # the actors would wait forever for CPUs the cluster does not have
            raise ValueError(f"{len(specs)} shards x shard_cpus={self.shard_cpus} need {need} "
                             f"CPUs; the Ray cluster has {have:g}")
        # actors of models just dropped give their CPUs back a moment after being killed
        deadline = time.monotonic() + FREE_CPU_WAIT_S
        while (free := ray.available_resources().get("CPU", 0)) < need \
                and time.monotonic() < deadline:
            time.sleep(0.2)
        if free < need:
            raise RuntimeError(f"{len(specs)} shards x shard_cpus={self.shard_cpus} need {need} "
                               f"CPUs; only {free:g} of the Ray cluster's {have:g} are free "
                               f"(other sharded models' actors hold the rest: close them with "
                               f"model.close())")
        cls = ray.remote(num_cpus=self.shard_cpus, max_restarts=-1)(_ShardActorImpl)
        files = files or [None] * len(specs)
        self.actors = [cls.remote(sp, f, self.memory_cap, self.n_threads)
                       for sp, f in zip(specs, files)]
        self._get([a.pid.remote() for a in self.actors])     # surface start-up errors here
        return self

    @property
    def n_shards(self):
        return len(self.actors)

    def _get(self, refs, compiled=False):
        """The results of actor calls (``refs``: ObjectRefs) or of a compiled graph's execution
        (``compiled``: its CompiledDAGRefs, which wait GRAPH_TIMEOUT_S, not Ray's 10 s: a
        shard's first batch compiles or loads its kernels); ShardFailure when an actor died
        or was restarted."""
        ray = self.ray
        try:
            if compiled:
                return [r.get(timeout=GRAPH_TIMEOUT_S) for r in refs]
            return ray.get(refs)
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError,
                ray.exceptions.RayChannelError) as exc:
            raise ShardFailure(f"a shard actor died: {exc}") from exc
        except ray.exceptions.RayTaskError as exc:
            if isinstance(getattr(exc, "cause", None), ShardRestartedError):
                raise ShardFailure(f"a shard actor was restarted: {exc.cause}") from exc
            raise

    def call_each(self, method, args_list):
        if method in self._graphs:
            return self.wait(self.submit_each(method, args_list))[0]
        return self._get([a.call.remote(method, *args)
                          for a, args in zip(self.actors, args_list)])

    def call_all(self, method, *args):
        refs = [self.ray.put(a) if hasattr(a, "nbytes") and a.nbytes > 65536 else a
                for a in args]
        return self._get([a.call.remote(method, *refs) for a in self.actors])

    def submit_each(self, method, args_list):
        """Send shard q ``method(*args_list[q])`` without waiting; ``wait`` gives the results.
        Through the compiled graph of ``method`` where ``compile_graph`` made one (Ray's
        compiled graphs: the messages travel through shared-memory channels, several times
        cheaper than actor calls, bench/results/ray_messages.md), else as actor calls (Ray
        runs an actor's calls from one caller in the order they were made, as a graph runs
        its executions)."""
        graph = self._graphs.get(method)
        if graph is not None:
            try:
                return Sent(True, graph.execute(*args_list), time.monotonic())
            except Exception as exc:      # a dead actor's channel
                self.close_graphs()
                raise ShardFailure(f"a shard actor died: {exc}") from exc
        return Sent(False, [a.timed_call.remote(method, args)
                            for a, args in zip(self.actors, args_list)], time.monotonic())

    def wait(self, handle):
        """(results in shard order, time the last shard finished) of a ``submit_each``."""
        try:
            if handle.compiled:
                self._nap(handle.sent)
            out = self._get(handle.refs, handle.compiled)
        except ShardFailure:
            self.close_graphs()
            raise
        done = max(t for _, t in out)
        self._turnarounds.append(done - handle.sent)
        # copies: a compiled graph's arrays may be views of its channels' buffers
        return [_copied(r) for r, _ in out], done

    def _nap(self, sent):
        """Sleep through most of a graph message's expected turnaround (NAP_SHARE of the
        median of the latest ones) before reading its reply: the graph's reader spins while
        it waits, and on a machine whose cores the driver shares with the shards that spinning
        takes a core from them (bench/results/ray_messages.md: the driver's CPU time a
        batch)."""
        if len(self._turnarounds) >= 4:
            expected = float(np.median(self._turnarounds))
            nap = sent + NAP_SHARE * expected - time.monotonic()
            if nap > 0:
                time.sleep(nap)

    def compile_graph(self, method, max_in_flight):
        """A compiled graph that sends shard q the q-th argument of each execution and calls
        its ``method`` (``submit_each`` and ``call_each`` then take it), with up to
        ``max_in_flight`` executions in flight; nothing to do when one stands that takes as
        many. It stands until ``close_graphs`` (a failure, ``shutdown``); the actors take
        plain calls beside it."""
        from ray.dag import InputNode, MultiOutputNode
        if self._graph_room.get(method, 0) >= max_in_flight:
            return
        self.close_graphs()
        with InputNode() as inp:
            dag = MultiOutputNode([a.timed_call.bind(method, inp[q])
                                   for q, a in enumerate(self.actors)])
        self._graphs[method] = dag.experimental_compile(
            _max_inflight_executions=int(max_in_flight))
        self._graph_room[method] = int(max_in_flight)

    def close_graphs(self):
        """Tear the compiled graphs down (the actors take plain calls only again)."""
        graphs, self._graphs, self._graph_room = self._graphs, {}, {}
        for g in graphs.values():
            try:
                g.teardown()
            except Exception:   # pragma: no cover - an actor of it died
                pass

    def wait_alive(self, timeout_s=RESTART_TIMEOUT_S):
        """Wait until every actor answers (Ray restarts a dead one; calls made meanwhile fail
        with 'the actor is restarting')."""
        ray = self.ray
        deadline = time.monotonic() + timeout_s
        for a in self.actors:
            while True:
                try:
                    ray.get(a.pid.remote(), timeout=timeout_s)
                    break
                except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError,
                        ray.exceptions.GetTimeoutError):
                    if time.monotonic() > deadline:
                        raise ShardFailure(f"a shard actor did not come back within "
                                           f"{timeout_s:.0f} s") from None
                    time.sleep(0.2)

    def reload(self, files):
        """Every shard back to its checkpoint file (after a restart: a rollback)."""
        self.wait_alive()
        return self._get([a.reload.remote(f) for a, f in zip(self.actors, files)])

    def memory(self):
        """Per shard actor: {"peak_rss", "peak_vm"} in bytes."""
        return self._get([a.memory.remote() for a in self.actors])

    def shutdown(self):
        self.close_graphs()
        for a in self.actors:
            try:
                self.ray.kill(a)
            except Exception:   # pragma: no cover - already gone
                pass
        self.actors = []
