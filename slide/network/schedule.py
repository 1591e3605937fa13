"""The rehash / rebuild schedule of the LSH tables."""
import math


class RehashSchedule:
    """When to rehash the LSH tables and rebuild the hash functions (SLIDE paper, sec. 4.2).

    The t-th rehash (t = 0, 1, ...) comes T_t = T_0 * exp(lambda * t) batches after the
    previous one (rounded, at least 1); rebuilds follow the same law with their own T_0
    (``rebuild_period``) and their own counter. lambda = 0 gives fixed periods. A rebuild also
    re-inserts every neuron, so a batch where both are due performs only the rebuild (and
    counts as both). The state (counters and next due batches) is plain ints: saved in
    checkpoints so a resumed run follows the same schedule.
    """

    def __init__(self, rehash_period, rebuild_period, decay):
        self.rehash_period = float(rehash_period)
        self.rebuild_period = float(rebuild_period)
        self.decay = float(decay)
        self.n_rehash = 0
        self.n_rebuild = 0
        self.next_rehash = self.period(self.rehash_period, 0)
        self.next_rebuild = self.period(self.rebuild_period, 0)

    def period(self, base, t):
        return max(1, int(round(base * math.exp(self.decay * t))))

    def periods(self, n, rebuild=False):
        """The first n periods (in batches), for inspection and tests."""
        base = self.rebuild_period if rebuild else self.rehash_period
        return [self.period(base, t) for t in range(n)]

    def step(self, batch):
        """Call after batch number ``batch`` (1-based count of batches trained so far).
        Returns (rehash, rebuild) flags for what is due now."""
        rehash = rebuild = False
        if batch >= self.next_rebuild:
            rebuild = True
            self.n_rebuild += 1
            self.next_rebuild = batch + self.period(self.rebuild_period, self.n_rebuild)
        if batch >= self.next_rehash:
            rehash = True
            self.n_rehash += 1
            self.next_rehash = batch + self.period(self.rehash_period, self.n_rehash)
        return rehash, rebuild

    def state(self):
        return [self.n_rehash, self.n_rebuild, self.next_rehash, self.next_rebuild]

    def set_state(self, st):
        self.n_rehash, self.n_rebuild, self.next_rehash, self.next_rebuild = (int(v) for v in st)
