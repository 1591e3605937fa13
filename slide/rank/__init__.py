"""The post-fit ranking stages over a trained network's hidden layer and output: the neighbour
vote (``vote``), per-label linear classifiers (``linear``), the logistic re-ranker
(``rerank``, over ``logistic``)."""
