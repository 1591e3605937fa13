"""``SlideSearch``: a grid search over a ``SlideClassifier``'s network parameters whose trials
train fused (``slide.fused``) and are scored on held-out rows, with scikit-learn's search
conventions (``best_params_``, ``best_estimator_``, ``cv_results_``, ``refit``).

The trials share the template's seed, so they differ only in the searched parameters: the
same initial weights where the shapes agree, the same order of rows, the same held-out rows.
Trials that agree in what one pass needs (``fused.PASS_PARAMS``: the batch size and the
epochs) train in one pass, side by side, whatever their layers; the groups train one after
another. Each trial is scored by the precision at ``SCORE_K`` (5) of its network alone
(exact, every label scored) on the held-out rows, which no trial trained on: the rows the
template's re-ranker would hold out (``slide.rank.rerank.holdout_rows``, the same draw a
``SlideClassifier`` fit makes), or ``validation_fraction`` of the rows for a
template without a re-ranker.

Successive halving (``factor``, as scikit-learn's ``HalvingGridSearchCV``, with training
batches for its resource). The trials train on their full schedules (epochs and learning
rates as each would get alone), but the search pauses them in rounds: in each round the
trials still in the search train on to a fraction of the schedule (``halving_rounds``:
1/9, then 1/3 for four trials by 3), rounded to an epoch's end, are scored, and the best
1/``factor`` of them go on; the last one left then trains to the end of its schedule, alone,
as its own fit trains (the template's ``batches_in_flight``; in the passes a trial trains one
batch at a time). Paused at an epoch's end, a trial goes on exactly as it would have without
the pause. ``factor=None`` trains every trial to the end, in its pass.

The winner is then finished as its own ``fit`` would finish it: its neighbour memory and
re-ranker fitted once, on the same split (``refit=True``), so ``best_estimator_`` is the model
``SlideClassifier(**best_params_).fit`` trains (bit for bit on one thread; with several
batches in flight, as different as two such fits). The ranking stages' parameters
(``neighbours``, ``neighbour_weight``, ``rerank``) are not searched: they are fitted once, for
the winner.
"""
import time
import warnings

import numpy as np

try:
    from sklearn.base import BaseEstimator, clone
    from sklearn.model_selection import ParameterGrid
except ImportError:  # pragma: no cover - scikit-learn is a dependency
    BaseEstimator = object

from sklearn.exceptions import FitFailedWarning, NotFittedError

from slide import fused as fused_mod
from slide import labels as labels_mod
from slide.data import cap_row_labels
from slide.data.inputs import take_rows
from slide.labels import encode
from slide.metrics import precision_at_k
from slide.network.trainer import blas_single_thread
from slide.params import is_real

# the search's own settings, and the ranking stages fitted once for the winner: never searched
NOT_SEARCHED = ("random_state", "n_threads", "time_budget", "verbose", "neighbours",
                "neighbour_weight", "rerank", "batches_in_flight")


def check_param_grid(param_grid, template):
    """The list of trials (dicts) of ``param_grid`` (a dict of lists, or a list of such
    dicts), each checked on a clone of ``template``; ValueError naming the bad key or value."""
    if isinstance(param_grid, dict):
        param_grid = [param_grid]
    if not isinstance(param_grid, (list, tuple)) or not param_grid:
        raise ValueError(f"param_grid must be a non-empty dict of lists or a list of them, "
                         f"got {param_grid!r}")
    known = set(template.get_params(deep=False))
    for grid in param_grid:
        if not isinstance(grid, dict) or not grid:
            raise ValueError(f"param_grid: each grid must be a non-empty dict, got {grid!r}")
        for key, values in grid.items():
            if key not in known:
                raise ValueError(f"param_grid: {key!r} is not a SlideClassifier parameter")
            if key in NOT_SEARCHED:
                raise ValueError(f"param_grid: {key!r} is not searched (the search's own "
                                 f"setting, or a ranking stage fitted once for the winner)")
            if isinstance(values, (str, bytes)) or not hasattr(values, "__len__") \
                    or len(values) == 0:
                raise ValueError(f"param_grid: {key!r} must list at least one value, "
                                 f"got {values!r}")
    trials = list(ParameterGrid(list(param_grid)))
    for params in trials:
        try:
            clone(template).set_params(**params)._checked_params()
        except ValueError as exc:
            raise ValueError(f"param_grid: the trial {params!r} is invalid: {exc}") from None
    return trials


# a trial's score: its network's precision at 5 on the held-out rows. The stages after the
# network re-rank its top labels, so what a trial gives them is its ranking below the first
# label: on debdeps the network at learning rate 0.003 had the better held-out P@1 (0.727-0.738
# against 0.723-0.730 at 0.01) and the whole model fitted on it the worse P@1, P@5 and PSP@5
# (bench/results/search_0540b6c_intel.md); its P@5 was the lower (docs/results.md)
SCORE_K = 5


# successive halving's factor: scikit-learn's default. Scored after 1/9 and 1/3 of its
# schedule, as four trials by 3 are, the learning-rate search's trials ranked the default rate
# first on 6 of 6 runs of debdeps and debcontents, as trained to the end they did on 3 of 6;
# the search then cost 1.31-1.36x one fit, against 2.3-2.6x with every trial trained to the end
# (bench/results/search_38c5a2e_intel.md, "Part-way through the schedule" and "Successive
# halving")
DEFAULT_FACTOR = 3


def halving_rounds(n_trials, factor):
    """The rounds of successive halving of ``n_trials`` trials by ``factor`` (None: none):
    (fraction of the schedule trained when the round scores, trials kept after it), the last
    keeping one. Round r of R scores at factor**(r - R - 1) of the schedule: four trials by
    3 are scored at 1/9 and 1/3 and keep 2, then 1."""
    if factor is None:
        return []
    kept = [int(n_trials)]
    while kept[-1] > 1:
        kept.append(-(-kept[-1] // int(factor)))
    n_rounds = len(kept) - 1
    return [(float(factor) ** (r - n_rounds - 1), kept[r]) for r in range(1, n_rounds + 1)]


class _Trials:
    """What the search records of each trial: its last score, the round and batches it was
    scored at, its passes' seconds and its pass's group."""

    def __init__(self, n):
        self.score = np.zeros(n)
        self.round = np.zeros(n, np.int64)
        self.batches = np.zeros(n, np.int64)
        self.seconds = np.zeros(n)
        self.group = np.zeros(n, np.int64)
        self.pass_seconds = 0.0

    def ranks(self):
        """1 for the winner: trials that reached a later round first, then by score, and the
        trials that diverged (score nan) last; ties share the better rank."""
        failed = np.isnan(self.score)
        order = np.lexsort((-np.where(failed, 0.0, self.score), -self.round, failed))
        ranks = np.empty(len(order), np.int64)
        ranks[order] = np.arange(1, len(order) + 1)
        for r in range(1, len(order)):
            a, b = order[r], order[r - 1]
            if (self.score[a], self.round[a]) == (self.score[b], self.round[b]):
                ranks[a] = ranks[b]
        return ranks


def _pass_key(model):
    """What trials trained in one pass share (``fused.PASS_PARAMS``)."""
    return tuple(getattr(model, name) for name in fused_mod.PASS_PARAMS)


class SlideSearch(BaseEstimator):
    """Grid search over ``SlideClassifier`` parameters, trials trained fused (module docstring).

    Parameters
    ----------
    estimator : SlideClassifier or None
        The template (unfitted); None: ``SlideClassifier()``. Its ``random_state`` seeds every
        trial (None: a fresh seed per fit); its ``time_budget``, if set, is the whole search's
        training (each pass an equal share; the winner's ranking stages come after it).
    param_grid : dict or list of dicts
        Parameter names to lists of values (scikit-learn's ``ParameterGrid``).
    validation_fraction : float in (0, 0.5]
        Share of the rows held out to score the trials when the template has no re-ranker
        (with one, its held-out rows score them).
    refit : bool
        Finish the winner: train it to the end of its schedule (with halving) and fit its vote
        and re-ranker, as ``best_estimator_``. False: stop when one trial is left.
    factor : int >= 2 or None
        Successive halving: keep the best 1/``factor`` of the trials after each round (module
        docstring). None: train every trial to the end and score it there.

    Fitted attributes: ``cv_results_`` (``params``, ``param_<name>``, ``mean_test_score``:
    held-out P@5 of the trial's network when last scored, nan for a trial that diverged (it
    stops with a ``FitFailedWarning``; the others go on), ``halving_round`` and ``n_batches``:
    the round and the batches trained then, ``rank_test_score``: the trials of later rounds
    first, then by score, ``mean_fit_time``: seconds of the trial's passes, shared by the
    trials fused in them, ``fused_group``), ``best_index_``, ``best_params_``,
    ``best_score_``, ``best_estimator_`` (``refit``), ``n_held_out_``, ``n_rounds_`` (of
    halving), ``train_seconds_`` (every pass and the winner's stages), ``seed_``.
    """

    def __init__(self, estimator=None, param_grid=None, validation_fraction=0.1, refit=True,
                 factor=DEFAULT_FACTOR):
        self.estimator = estimator
        self.param_grid = param_grid
        self.validation_fraction = validation_fraction
        self.refit = refit
        self.factor = factor

    def _validate(self):
        template = fused_mod.template_estimator(self.estimator)
        template._checked_params()
        if not is_real(self.validation_fraction) or \
                not 0.0 < float(self.validation_fraction) <= 0.5:
            raise ValueError(f"validation_fraction must be in (0, 0.5], got "
                             f"{self.validation_fraction!r}")
        if not isinstance(self.refit, (bool, np.bool_)):
            raise ValueError(f"refit must be True or False, got {self.refit!r}")
        if self.factor is not None and (isinstance(self.factor, (bool, np.bool_)) or
                                        not isinstance(self.factor, (int, np.integer)) or
                                        self.factor < 2):
            raise ValueError(f"factor must be an integer >= 2 or None, got {self.factor!r}")
        return template, check_param_grid(self.param_grid, template)

    def _split(self, model, n_rows, n_labels, seed):
        """(training rows, held-out rows, whether the winner's re-ranker uses them), for the
        trials of ``model`` (built with the search's seed)."""
        if model._n_held(n_rows, n_labels) > 0:
            fit_rows, held = model._rerank_split(n_rows, n_labels)
            return fit_rows, held, True
        n_held = max(1, int(round(float(self.validation_fraction) * n_rows)))
        if n_held >= n_rows:
            raise ValueError(f"{n_rows} rows are too few to hold some out for the search")
        perm = np.random.default_rng([int(seed) & 0xFFFFFFFF, 0x5EA2]).permutation(n_rows)
        return (np.sort(perm[n_held:]).astype(np.int64),
                np.sort(perm[:n_held]).astype(np.int64), False)

    def fit(self, X, Y, classes=None):
        """Train the trials (fused by shape) in rounds of successive halving, score them on
        the held-out rows, and finish the winner (``refit``). Y and ``classes``: as
        ``SlideClassifier.fit`` takes them."""
        template, trials = self._validate()
        seed = template.random_state
        if seed is None:
            seed = int(np.random.SeedSequence().generate_state(1)[0] & 0x7FFFFFFF)
        self.seed_ = int(seed)
        one_d = labels_mod.one_label_per_row(Y)
        Y, names = encode(Y, name="Y", classes=classes)
        models = [clone(template).set_params(**params, random_state=self.seed_,
                                             batches_in_flight=1, time_budget=None)
                  for params in trials]
        first = models[0]
        groups = {}
        for i, m in enumerate(models):
            groups.setdefault(_pass_key(m), []).append(i)
        groups = list(groups.values())
        rounds = halving_rounds(len(models), self.factor)
        n_threads = first._threads()
        # every trial's kernels as its pass runs them (a configuration compiled once per
        # process: cheap when the trials differ in values only), and a group's kernels as its
        # own fit runs them, as the last trial of a halving search trains on when refitted
        compile_seconds = sum(fused_mod.warm_up_members([models[i] for i in members], X, Y,
                                                        n_threads)
                              for members in groups)
        if rounds and self.refit:
            compile_seconds += sum(self._as_fitted_alone(models[members[0]], template)
                                   ._warm_up(X, Y) for members in groups)
        X, Y, names = first._check_training_data(X, Y, False, names)
        Y = cap_row_labels(Y, first.max_row_labels, self.seed_)
        for m in models:
            hs, sparse = m._checked_params()
            m._build(X.shape[1], Y.shape[1], hs, sparse)
            labels_mod.set_classes(m, names)
        fit_rows, held, for_rerank = self._split(first, X.shape[0], Y.shape[1], self.seed_)
        # the template's time_budget is the whole search's: each pass gets an equal share
        budget = template.time_budget
        share = None if budget is None else float(budget) / len(groups)
        state = _Trials(len(models))
        alive = list(range(len(models)))
        held_out = (take_rows(X, held), take_rows(Y, held))     # taken once: every round scores
        for r, (fraction, keep) in enumerate(rounds, start=1):
            alive = self._train(models, groups, alive, state, X, Y, fit_rows, share, fraction,
                                trials, r)
            self._score(models, alive, state, held_out, r)
            # the best ``keep`` go on (equal scores: the earlier trial)
            alive = sorted(sorted(alive, key=lambda i: -state.score[i])[:keep])
        if not rounds:
            alive = self._train(models, groups, alive, state, X, Y, fit_rows, share, None,
                                trials, 1)
            self._score(models, alive, state, held_out, 1)
        elif self.refit:
            self._finish(models, alive[0], template, state, X, Y, fit_rows, share)
            self._score(models, alive, state, held_out, len(rounds) + 1)
        ranks = state.ranks()
        self.cv_results_ = self._results(trials, state, ranks)
        self.best_index_ = int(np.argmin(ranks))
        self.best_params_ = dict(trials[self.best_index_])
        self.best_score_ = float(state.score[self.best_index_])
        self.n_held_out_ = int(held.shape[0])
        self.n_rounds_ = len(rounds)
        self.compile_seconds_ = float(compile_seconds)
        total = state.pass_seconds
        if self.refit:
            best = models[self.best_index_]
            labels_mod.set_target(best, one_d)
            t0 = time.perf_counter()
            if best.neighbours > 0 and not best.stopped_:
                best._build_memory(X, Y, (fit_rows, held) if for_rerank else None)
            total += time.perf_counter() - t0
            best.set_params(time_budget=template.time_budget)
            self.best_estimator_ = best
        self.train_seconds_ = total
        return self

    def _train(self, models, groups, alive, state, X, Y, fit_rows, share, fraction, trials,
               round_):
        """Train the ``alive`` trials, one pass a group, to ``fraction`` of their schedules
        (None: to the end): to that share of their epochs, at least one and rounded to an
        epoch's end, or of the pass's time budget ``share``. Returns the trials still alive:
        a trial that diverged stops, with a warning, scored nan in round ``round_`` (as
        scikit-learn's searches score a failed fit); ValueError when none is left."""
        failed = {}
        for g, members in enumerate(groups):
            members = [i for i in members if i in alive]
            if not members:
                continue
            ms = [models[i] for i in members]
            pause_epoch = pause_seconds = None
            if fraction is not None:
                epochs = ms[0].planned_batches(X.shape[0], Y.shape[1])[0]
                pause_epoch = max(1, int(round(fraction * epochs)))
                pause_seconds = None if share is None else fraction * share
            before = float(ms[0].train_seconds_)
            diverged = {}
            took = fused_mod.train_members(ms, X, Y, fit_rows, self.seed_, ms[0]._threads(),
                                           time_budget=share, pause_epoch=pause_epoch,
                                           pause_seconds=pause_seconds,
                                           diverged=diverged) - before
            state.seconds[members] += took
            state.group[members] = g
            state.pass_seconds += took
            failed.update((members[k], exc) for k, exc in diverged.items())
        for i, exc in sorted(failed.items()):
            state.score[i], state.round[i], state.batches[i] = np.nan, round_, exc.batch
            warnings.warn(f"SlideSearch: the trial {trials[i]!r} diverged and is out of the "
                          f"search (scored nan): {exc}", FitFailedWarning, stacklevel=3)
        alive = [i for i in alive if i not in failed]
        if not alive:
            raise ValueError(f"SlideSearch: every trial left in the search diverged "
                             f"(non-finite loss); lower the learning rates of param_grid, "
                             f"e.g. below {min(float(models[i].learning_rate) for i in failed):g}")
        return alive

    @staticmethod
    def _as_fitted_alone(model, template):
        """``model`` (a trial) with the template's ``batches_in_flight``: as its own fit would
        train (a trial trains one batch at a time in the search's passes)."""
        return clone(model).set_params(batches_in_flight=template.batches_in_flight)

    def _finish(self, models, winner, template, state, X, Y, fit_rows, share):
        """Train the last trial of a halving search on from its pause to the end of its
        schedule as its own fit trains it (``trainer.train``, the template's
        ``batches_in_flight``), within the pass's ``share`` of the time budget."""
        best = models[winner]
        best.set_params(batches_in_flight=template.batches_in_flight, time_budget=share)
        before = float(best.train_seconds_)
        best._train(X, Y, best.planned_batches(X.shape[0], Y.shape[1])[0], None, None,
                    rows=fit_rows)
        best.set_params(time_budget=None)
        took = float(best.train_seconds_) - before
        state.seconds[winner] += took
        state.pass_seconds += took

    def _score(self, models, alive, state, held_out, round_):
        """Score the ``alive`` trials on the held-out rows ``held_out`` ((X, Y)), in round
        ``round_``."""
        state.score[alive] = self._held_out_scores([models[i] for i in alive], *held_out)
        state.round[alive] = round_
        for i in alive:
            state.batches[i] = models[i].batches_

    @staticmethod
    def _held_out_scores(models, Xh, Yh):
        """P@``SCORE_K`` of each trial's network on the held-out rows (Xh, Yh)."""
        k = min(SCORE_K, Yh.shape[1])
        out = np.empty(len(models))
        for i, m in enumerate(models):
            m._threads()
            with blas_single_thread():
                top = m.network_.predict_topk_exact(Xh, k)
            out[i] = precision_at_k(Yh, top, k)
        return out

    @staticmethod
    def _results(trials, state, ranks):
        res = {"params": [dict(p) for p in trials], "mean_test_score": state.score.copy(),
               "rank_test_score": ranks, "mean_fit_time": state.seconds.copy(),
               "fused_group": state.group.copy(), "n_batches": state.batches.copy(),
               "halving_round": state.round.copy()}
        for key in sorted({k for p in trials for k in p}):
            col = np.ma.masked_all(len(trials), dtype=object)
            for i, p in enumerate(trials):
                if key in p:
                    col[i] = p[key]
            res[f"param_{key}"] = col
        return res

    # -- the winner's predictions ----------------------------------------------------------------
    def _best(self):
        if not hasattr(self, "best_estimator_"):
            raise NotFittedError("this SlideSearch has no best_estimator_: fit it (refit=True)")
        return self.best_estimator_

    @property
    def classes_(self):
        return self._best().classes_

    def predict_topk(self, X, k=5, **kw):
        return self._best().predict_topk(X, k=k, **kw)

    def predict_proba(self, X, **kw):
        return self._best().predict_proba(X, **kw)

    def predict(self, X, k=1):
        return self._best().predict(X, k=k)

    def score(self, X, y, **kw):
        return self._best().score(X, y, **kw)

    def save(self, path, extra=None):
        """The winner's checkpoint (``slide.load`` reads it back as a ``SlideClassifier``)."""
        self._best().save(path, extra)
