"""The tuned constants of the model, each with the measurement that chose it.

The user-facing parameters' defaults live in ``slide.params.TABLE`` (one table drives the
API, the TOML, the CLI help and docs/parameters.md); this module holds the constants inside
the stages that no parameter exposes. The stage modules read them as their own module
attributes (``slide.rank.rerank.MAX_HOLDOUT_ROWS`` is ``RERANK_MAX_HOLDOUT_ROWS``), so a
test can still set one there. Figures cite their files in ``bench/results/``.
"""

# ---------------------------------------------------------------------------------------------
# the network's training loop (slide.network.trainer)

# epochs="auto": enough epochs for about this many batches, 3 at least, 8 at most. With the
# whole model at width 256, 7-8 epochs against the 3 of the earlier 625 batches, 3 seeds beside
# the trees: debdeps P@5 +0.8 and PSP@5 +2.4 points, debcontents +0.0 and +0.9, P@1 level,
# for 1.2x and 1.4x the training (bench/results/accuracy_defaults_02c0d67_intel.md; probes on
# debtags and the presets: accuracy.md, round 11); sets of 715 batches an epoch or more
# (91,000 rows at batch 128) keep their 3
AUTO_EPOCH_BATCHES = 2500
AUTO_EPOCHS_MIN, AUTO_EPOCHS_MAX = 3, 8

# hidden_sizes="auto": one hidden layer of AUTO_HIDDEN_WIDTH where the model at that width
# (both layers' weights and Adam's two moments, float32) fits in AUTO_HIDDEN_MAX_MODEL_BYTES,
# else AUTO_HIDDEN_NARROW. On the two real sets, 3 seeds against width 128 (the default
# before): P@5 +0.17 and +0.12 points, PSP@5 +0.7 and +0.2, P@1 +0.2 and +0.1 (noise), for
# 1.2x the training (debdeps, debcontents: bench/results/width_88a78bd_intel.md;
# 512: P@5 +0.4 on debdeps only, for 1.7x). The bound keeps the Amazon-670K shape (806k
# features and labels: 2.5 GB at 256) at 128 and its peak memory under 2.5 GB
AUTO_HIDDEN_WIDTH = 256
AUTO_HIDDEN_NARROW = 128
AUTO_HIDDEN_MAX_MODEL_BYTES = 1 << 30

# ---------------------------------------------------------------------------------------------
# the neighbour vote (slide.rank.vote)

# similarities are raised to this power before voting: the nearest of the k rows count most
# (measured on debdeps/debtags, 1 to 48: 16 at the top by < 0.004 P@1, 1 close behind)
VOTE_POWER = 16.0

# ---------------------------------------------------------------------------------------------
# the re-ranker (slide.rank.rerank)

RERANK_N_TOP = 10               # the network's top labels among a row's candidates
RERANK_HOLDOUT = 0.1            # share of the training rows held out to fit the re-ranker ...
# ... at most MAX_HOLDOUT_ROWS (~300k candidates on debdeps' 4,547 held-out rows; their
# features are float64 [candidates, N_BASE])
RERANK_MAX_HOLDOUT_ROWS = 5000
RERANK_MIN_HOLDOUT_ROWS = 200   # fewer held-out rows than this: no re-ranker (77 weights)
# each held-out row costs one exact row of logits (n_labels dot products) and one search of
# the memory (n_rows): at most this many of both in all, but never fewer than
# LARGE_HOLDOUT_ROWS rows for it (Amazon-670K's 670k labels and 490k rows: 1,000 rows, ~8 s of
# features instead of 40 s for 5,000; debdeps' 71k: the 10 % is below the bound)
RERANK_MAX_HOLDOUT_WORK = 500_000_000
RERANK_LARGE_HOLDOUT_ROWS = 1000
# the centroids keep at most this many entries per label, and at most CENTROID_ENTRIES in
# all (at least 4 a label: at Amazon-670K's 670k labels 6, 32 MB a build; 128 up to 32k labels)
RERANK_CENTROID_TERMS = 128
RERANK_CENTROID_ENTRIES = 4 << 20
# the centroids' retrieval index (slide.rank.centroids): each row's this many best labels by
# its QUERY_TERMS heaviest words, each word listing the LABELS_PER_FEATURE labels whose
# centroids weigh it most, join its candidates. Off (0): on debcontents 50 of them raised the
# share of test rows with a true candidate from 85.9 to 88.4 % but not P@1 or P@5
# (bench/results/retrieval_debcontents_*.log)
RERANK_CENTROID_CANDIDATES = 0
RERANK_CENTROID_QUERY_TERMS = 30
RERANK_CENTROID_LABELS_PER_FEATURE = 100
# the word neighbours (slide.rank.words): the vote of a row's WORD_NEIGHBOURS nearest training
# rows by input cosine, similarities raised to WORD_POWER, is the re-ranker's word_vote feature;
# the labels of the WORD_NEW_ROWS nearest of them also join its candidates; at most
# WORD_MAX_ENTRIES input entries are indexed (a seeded subset of the rows beyond: 32 MB; at
# Amazon-670K's shape 8M entries took the fit's peak from 2,509 to 2,577 MB, engine_runs.jsonl).
# k and power: the word vote fused by hand with a fitted model on debcontents
# (bench/results/word_vote_debcontents_*.md); new rows: paired refits on two networks
# (bench/results/word_vote_debcontents_seed*_f11c4f9.md): P@1 +0.4 / +0.7 points with the vote
# as a feature only, +0.2 / -0.6 when all 20 rows' labels joined the candidates
WORD_NEIGHBOURS = 20
WORD_POWER = 2.0
WORD_NEW_ROWS = 0
WORD_VALUE_POWER = 0.5
WORD_MAX_ENTRIES = 4 << 20
RERANK_C = 1.0                  # the logistic regression's inverse L2 strength (the probe's)
RERANK_MAX_FIT_CANDIDATES = 400_000   # candidates the logistic regression is fitted on, at most

# ---------------------------------------------------------------------------------------------
# the per-label linear classifiers (slide.rank.linear)

LINEAR_N_NEGATIVES = 10         # the network's top labels per row that are trained as negatives
# the classifiers read a row's this many largest entries (renormalised): a wiki10-31k row has
# ~680, and each of its ~300 candidates would read every one at prediction, several times the
# prediction's time for no gain there; debdeps' rows have ~52
LINEAR_MAX_ROW_TERMS = 128
LINEAR_EPOCHS = 5
LINEAR_LEARNING_RATE = 0.2      # Adagrad's
LINEAR_MAX_BITS = 24            # at most 2**24 weights (64 MB, float32)
LINEAR_MIN_BITS = 16
LINEAR_MAX_WORK = 2_000_000_000  # rows x labels of exact logits for the hard negatives, at most
# logits computed at once, at most (16 MB: 2,048 rows x 32,768 labels were 268 MB of the
# fit's peak at Amazon-670K)
LINEAR_BLOCK_ENTRIES = 4 << 20
LINEAR_CHUNK = 32768            # output rows per product
# where the labels fit one chunk, at least this many rows a product: taller products keep BLAS
# busier (debdeps' 25,880 labels: 162 -> 512 rows a block, the hard negatives of 34k rows
# ~4.2 -> ~2.9 s on 2 cores; 53 MB of logits). Beyond one chunk
# BLOCK_ENTRIES alone bounds it.
LINEAR_MIN_BLOCK_ROWS = 512
# one-vs-rest: where rows x row terms x labels x OVR_EPOCHS is at most MAX_OVR_WORK (debtags:
# 585M, ~0.45 s on 2 cores), over at most MAX_OVR_WEIGHTS weights (64 MB float32; debtags'
# 33.8k features x 581 labels would be 79 MB: its 5k single-row features dropped, the same
# P@1 and P@5 over 5 seeds, round 9)
LINEAR_OVR_EPOCHS = 3
LINEAR_OVR_LEARNING_RATE = 0.2
LINEAR_MAX_OVR_WORK = 1_000_000_000
LINEAR_MAX_OVR_WEIGHTS = 1 << 24
# the head's one-vs-rest classifiers (slide.rank.head.HeadClassifiers): labels of at least
# this many fitting rows. On debcontents (paired refits on one network, 3 seeds, the score in a
# column of its own; bench/results/head_ovr_column_debcontents_27d221f.md) 100 rows gave P@1
# +0.0104 / +0.0069 / +0.0035 and 300 rows +0.0112 / +0.0072 / +0.0009
LINEAR_HEAD_MIN_ROWS = 100
# at most this many head labels (the most frequent), fitting rows (a seeded draw) and weights
# (the features in the most rows): the bounds that keep the head out of Amazon-670K's peak
# memory (its 485k fitting rows copied were 0.8 GB more at 16M weights); debcontents' head was
# as good at its 139 labels of 300+ rows as at 631 of 100+ (head_ovr_column_debcontents_27d221f)
LINEAR_HEAD_MAX_LABELS = 128
LINEAR_HEAD_MAX_ROWS = 40_000
LINEAR_HEAD_MAX_WEIGHTS = 1 << 22
