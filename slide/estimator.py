"""``SlideClassifier``: the scikit-learn style front end of the engine.

``__init__`` only stores its keywords (scikit-learn convention); ``fit`` validates them and the
data before any kernel runs, builds the network (``slide.network.Network``), the sparse
optimizer (``slide.network.optim``), the LSH indices of the sparse layers
(``slide.kernels.lsh``) and the rehash schedule, then trains one Numba call per batch, and
fits the post-fit stages (``slide.rank.stack.RankStack``). The training loop is
``slide.network.trainer``, the file format ``slide.persist.checkpoint``, the parameters'
types, defaults and bounds ``slide.params``.
"""
import time

import numba
import numpy as np
# BaseEstimator gives get_params / set_params / clone / repr
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.exceptions import NotFittedError

from slide import labels as labels_mod
from slide import params as params_mod, warmup
from slide.data import cap_row_labels
from slide.kernels import threads
from slide.kernels.lsh.hashes import check_hash_config
from slide.kernels.negatives import head_size
from slide.kernels.lsh.serving import default_prior
from slide.network import Network, trainer
from slide.network.optim import SparseOptimizer
from slide.network.schedule import RehashSchedule
from slide.network.trainer import DivergenceError, blas_single_thread  # noqa: F401 (re-exported)
from slide.params import is_int
from slide.persist.checkpoint import (FORMAT, FORMAT_VERSION,  # noqa: F401 (re-exported)
                                      CheckpointError, save as save_checkpoint)
from slide.rank.stack import RankStack
from slide.sklearn_api import ScikitLearnAPI, sklearn_constraints


class SlideClassifier(ScikitLearnAPI, ClassifierMixin, BaseEstimator):
    """Extreme multi-label classifier: sparse input -> ReLU hidden layers -> softmax output,
    trained by SLIDE (LSH-selected active neurons, sparse backprop, HOGWILD batches). Types,
    defaults and bounds of every parameter: ``slide.params`` (docs/parameters.md).

    Parameters
    ----------
    hidden_sizes : tuple of int or "auto"
        Hidden ReLU layer widths; "auto": 256, or 128 where the model would pass 1 GiB.
    hash_family, K, L, range_pow, bucket_size, bucket_policy :
        LSH of the sparse layers: family ("simhash", "wta", "dwta", "doph"), K hashes per
        table, L tables, 2**range_pow buckets per table, at most bucket_size neurons per bucket
        ("fifo" keeps the latest inserted, "reservoir" a uniform subset).
    sampler : "random" | "vanilla" | "topk" | "threshold" | "dense"
        How a sparse layer picks its active neurons. "random" (the default): no LSH, the true
        labels plus the batch's shared negatives drawn by label frequency (sampled softmax);
        the measured best: the same accuracy as the LSH samplers at equal active size, without
        hashing or rehash cost (``bench/results/lsh_study.md``). "vanilla" / "topk" /
        "threshold": LSH samplers that add each sample's candidates from the tables (the
        hash_family ... bucket_policy settings apply only to them). "dense": every output
        neuron active (exact full softmax; the dense reference network).
    sampler_budget : int
        Cap on the LSH candidates taken per sample, beyond the true labels and the shared
        negatives (not the total active size).
    sampler_threshold : int
        "threshold" sampler: minimum number of tables a neuron must appear in.
    min_active : int
        Each sample's active set is padded with its own random neurons up to this size.
    shared_negatives : int
        Negatives drawn by label frequency (see ``negative_power``) once per batch and made
        active for every sample of the batch (as TensorFlow's sampled softmax shares its
        negatives). They keep the sampled softmax's normaliser honest (LSH alone only proposes
        near neighbours); sharing them keeps the rows a batch touches -- the sparse
        optimizer's cost -- small.
    exact_head : float in [0, 1)
        The share of ``shared_negatives`` given to the most frequent labels: in every batch's
        block, computed exactly (no importance weight); the others are drawn by frequency
        from the remaining labels (``bench/results/lsh_block_debcontents.md``: half of a 1,024
        block exact, P@1 0.356 against 0.338 for 2,048 draws). Needs ``negative_power`` > 0.
    sampling_correction : bool
        Softmax only: add log(U / |R|) to the logits of the |R| uniform random negatives,
        which stand for the U output neurons neither forced nor LSH-selected (the logQ
        correction of sampled softmax), so the normaliser estimates the full softmax's.
    negative_power : float in [0, 2]
        0: the shared negatives are uniform. > 0: drawn with probability proportional to
        (training count + 1) ** negative_power, so the frequent labels, which carry most of the
        softmax's mass, are among them in nearly every batch; each drawn neuron's logit then
        gets -log P(drawn) (the importance weight) as its correction.
    output_bias_init : "log_prior" | "zero"
        "log_prior": before the first batch, the output biases are set to
        log((count + 1) / (n_samples + n_labels)) from the training labels, so training starts
        from the label prior (for softmax and sigmoid alike). "zero": the usual zero biases (the
        dense baselines' initialisation).
    sparse_layers : None or sequence of int
        Which layers (0 = first hidden layer, len(hidden_sizes) = output layer) use LSH; None =
        the output layer only. Ignored (no sparse layer) when sampler="dense".
    loss : "softmax" | "sigmoid" | "softmax_each" (see docs/parameters.md)
    optimizer : "adam" | "lazy_adam" | "sgd"
        "adam": bias-corrected Adam with dense Adam's trajectory at sparse cost (rows a batch
        does not touch still receive their decaying momentum, applied in closed form at their
        next touch or at ``sync``; see ``slide.network.optim``). "lazy_adam": moments and
        weights of a row change only in batches that touch it (TensorFlow's LazyAdam).
    learning_rate, beta1, beta2, epsilon : optimizer settings.
    lr_schedule : "constant" | "linear" | "cosine"
        The learning rate of each batch (``slide.network.trainer.scheduled_learning_rate``):
        constant, or, after ``warmup_batches`` batches of linear warm-up, decayed linearly or
        along a half cosine towards 0 at the last batch of ``epochs`` epochs.
    warmup_batches : int
        Batches of linear warm-up (0: none).
    batch_size : minibatch size.
    max_row_labels : int
        ``fit`` trains every stage on at most this many labels of a row, a random subset
        drawn once with the seed (``slide.data.cap_row_labels``). 0: every label.
    epochs : int or "auto"
        Passes of ``fit`` over the training set. "auto" (the default): 3, or more on small
        training sets, enough for about 2500 batches over all the rows given to ``fit`` (at most
        8; ``slide.network.trainer.resolve_epochs``), run over the rows the network trains on (the
        re-ranker's held-out rows left out; ``planned_batches``).
    time_budget : float or None
        Seconds of training (``train_seconds_``, compilation excluded) after which ``fit``
        stops (``budget_spent_`` then says so), with the learning-rate schedule planned to end
        there: the decay follows the share of the budget spent or of the batches done,
        whichever is further along, so ``epochs`` becomes the cap. Not bit-reproducible.
    neighbours : int
        Exact predictions blend the network's probabilities with the label vote of the query's
        ``neighbours`` nearest training rows in the last hidden layer (``slide.rank.vote``;
        the memory of the training rows is built at the end of ``fit``). 0: the network alone.
    neighbour_weight : float in [0, 1]
        The vote's share of the blend: (1 - w) * p_network + w * vote.
    rerank : bool
        With the vote (``neighbours`` > 0) and at least 2,000 training rows: ``fit`` trains
        the network on 90 % of the rows (seeded; all but 5,000 on large sets, fewer held out
        where labels and rows are many), trains per-label linear classifiers over the input
        on those rows (one-vs-rest where labels are few, else against the network's top
        labels: ``slide.rank.linear``), fits a logistic regression over features of each
        held-out row's candidates (the network's top 10 and the neighbours' labels; their
        scores, counts, input-centroid cosine and linear classifier score) and then builds
        the memory over every row (``slide.rank.rerank``). Exact ``predict_topk`` ranks the
        candidates by it; ``predict_proba`` stays the fixed blend. False (also after ``fit``,
        by ``set_params``): the fixed blend everywhere.
    rehash_period, rebuild_period, rehash_decay : rehash the tables after T_t = rehash_period
        * exp(rehash_decay * t) batches (t: rehashes so far), rebuild after rebuild_period * ...
    n_threads : int or None (all cores)
    batches_in_flight : int or "auto" (batches trained at once over the shared weights,
        ``slide.network.inflight``; above 1 results vary from run to run; above 4 the
        first quarter of the batches trains with 4)
    random_state : int or None
    verbose : int (0 silent, 1 per epoch and the kernels' first compile, 2 every 100 batches)
    """

    _BUILT_ATTR = "network_"     # set by _build: the model holds trained state

    # scikit-learn's declaration of the parameters (its _validate_params and estimator
    # checks read it), generated from slide.params' table like every other spelling of them
    _parameter_constraints = sklearn_constraints()

    def __init__(self, hidden_sizes="auto", hash_family="dwta", K=6, L=50, range_pow=18,
                 bucket_size=128, bucket_policy="fifo", sampler="random", sampler_budget=1024,
                 sampler_threshold=2, min_active=0, shared_negatives=1024, exact_head=0.5,
                 sampling_correction=True, negative_power=1.0, output_bias_init="log_prior",
                 sparse_layers=None, loss="softmax", optimizer="adam", learning_rate=1e-2,
                 lr_schedule="cosine", warmup_batches=0, beta1=0.9, beta2=0.999, epsilon=1e-8,
                 batch_size=128, max_row_labels=256, epochs="auto", rehash_period=50,
                 rebuild_period=500, rehash_decay=0.02, n_threads=None, random_state=None,
                 verbose=0, time_budget=None, neighbours=20, neighbour_weight=0.85, rerank=True,
                 engine="batched", batches_in_flight="auto"):
        self.hidden_sizes = hidden_sizes
        self.hash_family = hash_family
        self.K = K
        self.L = L
        self.range_pow = range_pow
        self.bucket_size = bucket_size
        self.bucket_policy = bucket_policy
        self.sampler = sampler
        self.sampler_budget = sampler_budget
        self.sampler_threshold = sampler_threshold
        self.min_active = min_active
        self.shared_negatives = shared_negatives
        self.exact_head = exact_head
        self.sampling_correction = sampling_correction
        self.negative_power = negative_power
        self.output_bias_init = output_bias_init
        self.sparse_layers = sparse_layers
        self.loss = loss
        self.optimizer = optimizer
        self.learning_rate = learning_rate
        self.lr_schedule = lr_schedule
        self.warmup_batches = warmup_batches
        self.beta1 = beta1
        self.beta2 = beta2
        self.epsilon = epsilon
        self.batch_size = batch_size
        self.max_row_labels = max_row_labels
        self.epochs = epochs
        self.rehash_period = rehash_period
        self.rebuild_period = rebuild_period
        self.rehash_decay = rehash_decay
        self.n_threads = n_threads
        self.engine = engine
        self.batches_in_flight = batches_in_flight
        self.random_state = random_state
        self.verbose = verbose
        self.time_budget = time_budget
        self.neighbours = neighbours
        self.neighbour_weight = neighbour_weight
        self.rerank = rerank

    # ------------------------------------------------------------------------------------------
    # validation
    # ------------------------------------------------------------------------------------------
    def _checked_params(self):
        """Check every hyperparameter against ``slide.params``; raise ValueError naming the
        offending one, then scikit-learn's ``_validate_params`` over the constraints generated
        from the same table. Returns (hidden sizes, a tuple or "auto"; sparse layer indices)."""
        values = params_mod.check_estimator_params(self.get_params(deep=False))
        self._validate_params()
        hs = params_mod.hidden_sizes_value(values["hidden_sizes"])
        n_layers = params_mod.hidden_layer_count(hs) + 1
        if self.sampler == "dense":
            sparse = ()
        elif self.sparse_layers is None:
            sparse = (n_layers - 1,)
        else:
            try:
                sparse = tuple(self.sparse_layers)
            except TypeError:
                raise ValueError(f"sparse_layers must be None or a sequence of layer indices, "
                                 f"got {self.sparse_layers!r}") from None
            for l in sparse:
                if not is_int(l) or not 0 <= l < n_layers:
                    raise ValueError(f"sparse_layers entries must be layer indices in "
                                     f"[0, {n_layers - 1}], got {l!r}")
        if sparse and self.sampler != "random":
            check_hash_config(self.hash_family, self.K, self.L, self.range_pow)
        return hs, tuple(sorted(set(int(l) for l in sparse)))

    # ------------------------------------------------------------------------------------------
    # building
    # ------------------------------------------------------------------------------------------
    def _threads(self):
        n = threads.threads_for(self.n_threads)
        numba.set_num_threads(n)
        return n

    def _set_identity(self, n_features, n_labels, seed):
        """``seed_`` (``seed``, else ``random_state``, else a fresh one), ``n_features_in_``,
        ``n_labels_`` of a model being built."""
        if seed is None:
            seed = self.random_state
        if seed is None:
            seed = int(np.random.SeedSequence().generate_state(1)[0])
        self.seed_ = int(seed)
        self.n_features_in_ = int(n_features)
        self.n_labels_ = int(n_labels)
        labels_mod.set_classes(self, None)      # ids until fit names them
        self._fix_vote_settings()

    def _build(self, n_features, n_labels, hs, sparse, seed=None):
        """Fresh network, optimizer and schedule; a checkpoint's ``seed`` overrides random_state."""
        self._set_identity(n_features, n_labels, seed)
        hs = trainer.resolve_hidden_sizes(hs, n_features, n_labels)
        sizes = (n_features,) + hs + (n_labels,)
        n_layers = len(sizes) - 1
        flags = [l in sparse for l in range(n_layers)]
        mins = [int(self.min_active) if flags[l] else 0 for l in range(n_layers)]
        lsh = None
        if sparse:
            lsh = dict(sampler=self.sampler, family=self.hash_family, K=int(self.K),
                       L=int(self.L), range_pow=int(self.range_pow),
                       bucket_size=int(self.bucket_size), policy=self.bucket_policy,
                       budget=int(self.sampler_budget), threshold=int(self.sampler_threshold))
        self.network_ = Network(sizes, flags, mins, loss=self.loss, seed=self.seed_, lsh=lsh,
                                shared_negatives=int(self.shared_negatives),
                                shared_head=head_size(self.shared_negatives, self.exact_head),
                                correct=bool(self.sampling_correction),
                                negative_power=float(self.negative_power),
                                engine=self.engine)
        self.optimizer_ = SparseOptimizer(self.optimizer, self.network_.layout,
                                          self.learning_rate, self.beta1, self.beta2,
                                          self.epsilon)
        self.schedule_ = RehashSchedule(self.rehash_period, self.rebuild_period,
                                        self.rehash_decay)
        self.rank_ = RankStack()        # the post-fit stages, fitted at the end of fit
        self.sparse_layers_ = tuple(sparse)
        self.hidden_sizes_ = hs
        self._set_position(batches=0, samples=0, epoch=0, batch_in_epoch=0, train_seconds=0.0,
                           history=[])

    # ------------------------------------------------------------------------------------------
    # training
    # ------------------------------------------------------------------------------------------
    def fit(self, X, Y, eval_set=None, callback=None, resume=False, classes=None):
        """Train for ``epochs`` passes over (X, Y) (``"auto"``: ``trainer.resolve_epochs``).

        resume=False: fresh initialisation. resume=True: continue a model that was stopped by
        its callback (or loaded from a checkpoint) exactly where it stopped, until ``epochs``
        epochs are complete. ``callback(model, info)`` runs after every batch (after the
        epoch's closing sync when the batch ends an epoch; with several batches in flight,
        once a wave, as after its last batch, ``info["batches"]`` its size); a true return
        value stops training after that batch. Before training, the kernels the run uses are
        compiled (once per process and configuration, ``slide.warmup``):
        ``compile_seconds_`` holds that time, ``train_seconds_`` never includes it.

        Y: a 0/1 matrix, label lists of ids or of names, or a 1-D array of names
        (``slide.labels``: which is read how); ``classes``: the names of Y's labels (of a
        matrix's columns, e.g. ``MultiLabelBinarizer.classes_``), fixing their order. The
        fitted ``classes_`` name the output columns.
        """
        self._checked_params()
        compile_seconds = self._warm_up(X, Y)
        self._fit_core(X, Y, eval_set, callback, resume, classes)
        self.compile_seconds_ = compile_seconds
        return self

    def _warm_up(self, X=None, Y=None, then=()):
        """Compile the run's kernels before its clock starts (``slide.warmup``, which see for
        ``then``; with the training data, only the linear classifiers it selects): the
        seconds go to ``compile_seconds_``, never to ``train_seconds_``."""
        self._threads()
        return warmup.warm_up(self, X, Y, then)

    def _fit_core(self, X, Y, eval_set, callback, resume, classes=None):
        """``fit`` without the warm-up (the warm-up's own tiny fit runs through here)."""
        hs, sparse = self._checked_params()
        fitted = resume and self._built()
        X, Y, names = self._check_training_data(X, Y, fitted, classes)
        if not fitted:
            self._build(X.shape[1], Y.shape[1], hs, sparse)
            labels_mod.set_classes(self, names)
        Y = cap_row_labels(Y, self.max_row_labels, self.seed_)     # every stage's labels
        if eval_set is not None:
            eval_set = self._check_eval_set(eval_set, X, Y)
        split = self._rerank_split(X.shape[0], Y.shape[1])
        self._train(X, Y, self.planned_batches(X.shape[0], Y.shape[1])[0], eval_set, callback,
                    rows=None if split is None else split[0])
        if self.neighbours > 0 and not self.stopped_:
            # part of training: its seconds count in train_seconds_. A fit its callback stopped
            # is left as it stopped (it may be resumed: building the memory syncs the
            # optimizer, which would change the resumed trajectory); fit_neighbours builds it
            t0 = time.perf_counter()
            self._build_memory(X, Y, split)     # X, Y checked above: no second copy of them
            self.train_seconds_ += time.perf_counter() - t0

    # private, lowered by the warm-up's tiny fit: the rows held out for the re-ranker at least,
    # and the one-vs-rest classifiers' cap (linear.MAX_OVR_WORK where None; -1: none)
    _rerank_min_holdout = _max_ovr_work = None

    def _n_held(self, n_rows, n_labels):
        """Rows of n_rows that ``fit`` holds out for the re-ranker (0: no re-ranker)."""
        if not (self.rerank and self.neighbours > 0):
            return 0
        return RankStack.n_held(n_rows, n_labels, self._rerank_min_holdout)

    def _rerank_split(self, n_rows, n_labels):
        """(network rows, held-out rows) of a fit that fits the re-ranker, else None."""
        if self._n_held(n_rows, n_labels) == 0:
            return None
        return RankStack.split(n_rows, n_labels, self.seed_, self._rerank_min_holdout)

    def planned_batches(self, n_rows, n_labels):
        """(epochs, batches an epoch) that ``fit`` trains on n_rows rows of n_labels labels.
        ``epochs="auto"`` resolves from all n_rows (``trainer.resolve_epochs``; the rule was
        measured on whole training sets), the epochs then run over the rows the network trains
        on (the re-ranker's held-out rows left out)."""
        epochs = trainer.resolve_epochs(self.epochs, n_rows, self.batch_size)
        n_train = int(n_rows) - self._n_held(n_rows, n_labels)
        return epochs, max(1, -(-n_train // int(self.batch_size)))

    def fit_neighbours(self, X, Y):
        """Build the neighbour memory (``slide.rank.vote``) from the labelled rows (X, Y) with
        the current weights: exact predictions then blend the vote of the ``neighbours``
        nearest of these rows. ``fit`` does this with its training rows when it completes (or
        spends its ``time_budget``), not when its callback stopped it; ``partial_fit`` and
        any resumed training drop the memory (the weights it was built from changed): call
        this again afterwards. Returns self."""
        self._check_fitted()
        X, Y = self._check_data(X, Y, fitted=True)
        self._build_memory(X, Y)
        return self

    def _build_memory(self, X, Y, split=None):
        """``fit_neighbours`` on rows already checked (``_check_data`` copies its input);
        with ``split`` (network rows, held-out rows) the re-ranker is fitted first."""
        self._threads()
        self._fix_vote_settings()
        self.sync()
        self.network_.release_scratch()
        if split is None:
            self.rank_.fit(self.network_.hidden(X), self._output(), X, Y, int(self.neighbours))
            return
        with blas_single_thread():
            self.rank_.fit(self.network_.hidden(X), self._output(), X, Y, int(self.neighbours),
                           split, self.seed_, max_ovr_work=self._max_ovr_work)

    def _output(self):
        """The output layer as the ranking stages read it (``slide.kernels.output``)."""
        return self.network_.output_layer()

    def _exact_topk(self, X, k, with_scores, neighbours=None, rerank=None):
        """Exact top-k of checked rows X (BLAS held to one thread by the caller): by the
        re-ranker (``_reranks``), else the network blended with the neighbour vote when the
        model has its memory, else the logits. ``with_scores``: (ids, those probabilities or
        the logits). ``neighbours`` / ``rerank``: this call's (None: as fitted)."""
        vote = self._neighbour_vote(neighbours)
        if vote is None:
            return self.network_.predict_topk_exact(X, k, with_scores=with_scores)
        H = self.network_.hidden(X)
        if self._reranks(neighbours, rerank):
            out = self.rank_.topk_reranked(H, self._output(), X, k)
        else:
            out = self.rank_.topk_blended(H, self._output(), k, *vote)
        return out if with_scores else out[0]

    def _reranks(self, neighbours=None, rerank=None):
        """Whether exact top-k ranks by the re-ranker: it is on, fitted, and has the vote's
        memory (``neighbours`` / ``rerank``: this call's switches; None: as fitted)."""
        on = self.rerank_ if rerank is None else rerank
        return bool(on and self.rank_.reranker is not None and self._neighbour_vote(neighbours))

    def _neighbour_vote(self, neighbours=None):
        """Whether exact predictions blend in the neighbour vote: (k, weight) or None
        (``neighbours``: this call's vote size; None: the fitted ``neighbours_``)."""
        k = self.neighbours_ if neighbours is None else int(neighbours)
        if k <= 0 or self.rank_.memory is None:
            return None
        return int(k), float(self.neighbour_weight_)

    def partial_fit(self, X, Y, classes=None):
        """One more epoch over (X, Y), continuing the current state (initialised on first
        call). Names: the first call fixes ``classes_`` (from Y, or from ``classes``: pass every
        name there when later calls may bring others); later calls refuse a name not among them."""
        hs, sparse = self._checked_params()
        compile_seconds = self._warm_up()
        fitted = self._built()
        X, Y, names = self._check_training_data(X, Y, fitted, classes)
        if not fitted:
            self._build(X.shape[1], Y.shape[1], hs, sparse)
            labels_mod.set_classes(self, names)
        Y = cap_row_labels(Y, self.max_row_labels, self.seed_)
        self.compile_seconds_ = compile_seconds
        self.batch_in_epoch_ = 0
        self._train(X, Y, self.epoch_ + 1, None, None)
        return self

    def _built(self):  # whether the model holds trained state (``_build`` ran)
        return hasattr(self, self._BUILT_ATTR)

    @classmethod
    def _load_directory(cls, path):
        """Unpickling's hook for directory checkpoints, which only sharded models write."""
        raise ValueError(f"{path}: a {cls.__name__} checkpoint is one file, not a directory")

    def _adopt_state(self):
        """Unpickling copied a loaded model's attributes here: nothing of ours points back."""

    def _train(self, X, Y, end_epoch, eval_set, callback, rows=None):
        trainer.train(self, X, Y, end_epoch, eval_set, callback, rows=rows)

    def _ensure_lsh(self):
        trainer.ensure_lsh(self)

    def _set_position(self, batches, samples, epoch, batch_in_epoch, train_seconds, history):
        """Where training stands (a checkpoint's position, or the start of a fresh fit)."""
        self.batches_ = batches         # batches trained so far (the batch serial)
        self.samples_ = samples
        self.epoch_ = epoch             # position of the next batch: epoch ...
        self.batch_in_epoch_ = batch_in_epoch   # ... and batch within it
        self.train_seconds_ = train_seconds
        self.history_ = history

    # ------------------------------------------------------------------------------------------
    # inference
    # ------------------------------------------------------------------------------------------
    def _check_fitted(self):
        if not hasattr(self, "network_"):
            raise NotFittedError("this SlideClassifier is not fitted yet; call fit first")

    def sync(self):
        """Apply the optimizer's pending zero-gradient steps (``optimizer="adam"``: dense Adam's
        momentum on rows a batch did not touch), so the weights are those dense Adam would
        hold. Runs at the end of every epoch and before inference; call it before reading
        ``network_.W`` of a model stopped mid-epoch. Deterministic: a run that syncs at the
        same batches trains identically."""
        self._check_fitted()
        self.optimizer_.flush(self.network_.W, self.network_.B)
        return self

    def predict_topk(self, X, k=5, exact=True, prior_candidates=None, *, neighbours=None,
                     rerank=None, return_names=False):
        """(n, k) int64 label ids (column ids of ``classes_``), best first; ``return_names=True``:
        the labels' names, ``classes_[ids]``. ``neighbours`` / ``rerank``: this call's vote size
        and re-ranker switch (None: as fitted, ``neighbours_`` / ``rerank_``; ``set_params``
        after ``fit`` does not change them). exact=True scores every output neuron, blended with
        the neighbour vote of the training rows when the model has its memory (``neighbours``,
        ``slide.rank.vote``); exact=False is sparse serving, by the network alone: the output
        layer's serving index (``slide.kernels.lsh.serving``: LSH tables over [w ; b], built
        from the weights on first use, kept until training changes them, saved with the model)
        picks each row's most-colliding labels, and those plus the ``prior_candidates`` labels
        with the highest bias (the same for every row; 0 for none; None: 2 % of the labels, at
        least 256) are scored exactly. It works the same whichever sampler trained the model.
        Measured (``bench/results/serving.md``): the prior list, not the LSH, carries the recall
        of the exact top-k."""
        self._check_fitted()
        if prior_candidates is not None and (not is_int(prior_candidates)
                                             or prior_candidates < 0):
            raise ValueError(f"prior_candidates must be a non-negative integer or None, "
                             f"got {prior_candidates!r}")
        self._check_switches(neighbours, rerank)
        X = self._check_predict_args(X, k)
        with blas_single_thread():     # OpenBLAS vs Numba thread contention (slide.network.trainer)
            if exact:
                ids = self._exact_topk(X, int(k), False, neighbours, rerank)
            else:
                if prior_candidates is None:
                    prior_candidates = default_prior(self.n_labels_)
                ids = self.network_.predict_topk_serving(X, int(k),
                                                         prior_candidates=int(prior_candidates))
        return labels_mod.names_of(self, ids) if return_names else ids

    def serving_index(self, n_bits=None, n_tables=None, n_candidates=None, n_ranges=None):
        """The serving index sparse ``predict_topk`` uses (built now if missing, or rebuilt
        with the given settings; each one left None is derived from the label count and the
        hidden width: ``slide.kernels.lsh.serving.serving_config``). Returns the index."""
        self._check_fitted()
        self.sync()
        with blas_single_thread():
            return self.network_.serving_index(n_bits=n_bits, n_tables=n_tables,
                                               n_candidates=n_candidates, n_ranges=n_ranges)

    def _prepare_inference(self, X):
        """Fitted and X valid; threads set and the weights synced. Returns X (canonical)."""
        self._check_fitted()
        X = self._check_data(X, fitted=True)
        self._threads()
        self.sync()
        return X

    def _check_predict_args(self, X, k):
        """``_prepare_inference`` after checking that k is an integer in [1, n_labels_]."""
        self._check_fitted()
        params_mod.check_k(k, self.n_labels_)
        return self._prepare_inference(X)

    def predict_topk_scored(self, X, k=5, *, neighbours=None, rerank=None):
        """Exact top-k with the score that ranked each label: (ids [n, k] int64, scores [n, k]
        float64): the blended probability with the neighbour vote, else the logit
        (``neighbours`` / ``rerank``: as ``predict_topk``'s)."""
        self._check_switches(neighbours, rerank)
        X = self._check_predict_args(X, k)
        with blas_single_thread():
            return self._exact_topk(X, int(k), True, neighbours, rerank)

    def predict_proba(self, X, *, neighbours=None):
        """Dense label probabilities [n, n_labels] (float32) of exact inference: the softmax
        of the network's logits (the per-label sigmoid for loss="sigmoid"), blended with the
        neighbour vote when the model has its memory (``neighbours``). Mind the size at many
        labels: ``predict_topk`` needs no dense matrix. ``neighbours``: as ``predict_topk``'s.
        """
        self._check_switches(neighbours, None)
        X = self._prepare_inference(X)
        vote = self._neighbour_vote(neighbours)
        with blas_single_thread():
            if vote is None:
                return self.network_.predict_proba(X)
            return self.rank_.proba(self.network_.hidden(X), self._output(), *vote)

    def predict_scores(self, X):
        """Dense output logits [n, n_labels] of the exact network (all neurons; the
        neighbour vote is not in them: ``predict_proba`` has the blend)."""
        X = self._prepare_inference(X)
        with blas_single_thread():
            return self.network_.predict_scores(X)

    def predict(self, X, k=1):
        """scikit-learn's multi-label form, a sparse int8 (n_samples, n_labels) indicator of each
        row's ``k`` best labels, columns as ``classes_`` (a 1-D ``y``: 1-D names; k = 1);
        ``slide.labels.predict``."""
        return labels_mod.predict(self, X, k)

    def score(self, X, y, exact=True, prior_candidates=None):
        """Precision@1 of the top prediction (``predict_topk``'s inference options); y, the
        true labels, as ``fit`` takes its Y, its names among ``classes_``."""
        self._check_fitted()
        X, Y = self._check_data(X, y, fitted=True)
        top = self.predict_topk(X, k=1, exact=exact, prior_candidates=prior_candidates)[:, 0]
        hit = np.asarray(Y[np.arange(X.shape[0]), top]).ravel()
        return float(hit.mean())

    # ------------------------------------------------------------------------------------------
    # checkpoints
    # ------------------------------------------------------------------------------------------
    def save(self, path, extra=None, optimizer_state=True):
        """Write a checkpoint (``slide.persist.checkpoint``) atomically; ``extra``: any JSON value,
        ``extra_`` after ``slide.load``. ``optimizer_state=False``: synced weights without Adam's
        moments (2/3 of the network's arrays): the loaded model predicts alike, cannot train on."""
        self._check_fitted()
        save_checkpoint(self, path, extra, optimizer_state=optimizer_state)

    def sample_loss_and_grads(self, x_indices, x_data, labels, return_active=False):
        """One sample's loss and flat gradients (``network_.layout``'s W, B), updating nothing."""
        self._check_fitted()
        self._ensure_lsh()
        return self.network_.sample_loss_and_grads(x_indices, x_data, labels,
                                                   return_active=return_active)
