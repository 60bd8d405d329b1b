"""
Quickstart: TransformerGMM beside GaussianMixture
=================================================

Fit ``TransformerGMM`` and scikit-learn's ``GaussianMixture`` on the same synthetic
mixture. Prints, for each, the error of the means (matched to the true ones), the mean
log-likelihood per sample, and the fit time.

    python examples/quickstart.py
"""

import time

import numpy as np
from scipy.optimize import linear_sum_assignment
from sklearn.mixture import GaussianMixture

from transformer_gmm import TransformerGMM

# A mixture of 4 spherical Gaussians in 8 dimensions (the TGMM papers' setting).
rng = np.random.default_rng(0)
n_components, n_features, n_samples = 4, 8, 512
true_means = rng.uniform(-5, 5, (n_components, n_features))
true_weights = rng.uniform(0.2, 0.8, n_components)
true_weights /= true_weights.sum()
labels = rng.choice(n_components, n_samples, p=true_weights)
X = true_means[labels] + rng.standard_normal((n_samples, n_features))


def mean_error(means: np.ndarray) -> float:
    """Root mean squared error per coordinate, after matching components (Hungarian)."""
    cost = ((means[:, None, :] - true_means[None, :, :]) ** 2).mean(axis=2)
    rows, cols = linear_sum_assignment(cost)
    return float(np.sqrt(cost[rows, cols].mean()))


estimators = {
    "TransformerGMM": TransformerGMM(n_components, covariance_type="spherical", random_state=0),
    "GaussianMixture": GaussianMixture(n_components, covariance_type="spherical", random_state=0),
}
print(f"{'estimator':<16} {'mean error':>10} {'log-lik':>9} {'fit ms':>8}  init")
for name, estimator in estimators.items():
    estimator.fit(X)  # warm-up: the first fit loads the checkpoint
    start = time.perf_counter()
    estimator.fit(X)
    elapsed_ms = 1000 * (time.perf_counter() - start)
    init = getattr(estimator, "init_method_", "k-means")
    print(
        f"{name:<16} {mean_error(estimator.means_):>10.4f} {estimator.score(X):>9.4f} "
        f"{elapsed_ms:>8.1f}  {init}"
    )
