"""The post-fit ranking stages over a trained network's hidden layer and output layer (read
through ``slide.kernels.output.OutputLayer``, never the ``Network``): the neighbour vote
(``vote``), per-label linear classifiers (``linear``), the logistic regression (``logistic``)
and the re-ranker over the vote's candidates (``rerank``); ``stack.RankStack`` owns the
held-out split, their fit order and the predictions."""
