"""
Quickstart: TransformerGMM beside GaussianMixture
=================================================

Fit ``TransformerGMM`` and scikit-learn's ``GaussianMixture`` on the same synthetic
mixture. Prints, for each, the error of the means (matched to the true ones), the mean
log-likelihood per sample, and the fit time; the figure (where matplotlib is installed)
shows the data on its first two principal components, with the true means and both
estimators' means.

    python examples/quickstart.py
"""

import time

import numpy as np
from scipy.optimize import linear_sum_assignment
from sklearn.decomposition import PCA
from sklearn.mixture import GaussianMixture

from transformer_gmm import TransformerGMM

try:
    import matplotlib.pyplot as plt
except ImportError:  # the package alone installs no plotting library: the table is the result
    plt = None

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

# Eight dimensions, seen on the two principal directions of the data.
if plt is None:
    print("\n(pip install matplotlib to see the means on a figure)")
else:
    pca = PCA(n_components=2).fit(X)
    fig, ax = plt.subplots(figsize=(6, 5))
    ax.scatter(*pca.transform(X).T, c=labels, s=8, cmap="viridis", alpha=0.5)
    ax.scatter(*pca.transform(true_means).T, marker="*", s=300, color="black",
               label="true means")
    for (name, estimator), marker in zip(estimators.items(), ["x", "+"], strict=True):
        ax.scatter(*pca.transform(estimator.means_).T, marker=marker, s=150, lw=2, label=name)
    ax.set(xlabel="first principal component", ylabel="second principal component",
           title="4 Gaussians in 8 dimensions: true and fitted means")
    ax.legend()
    fig.tight_layout()
    plt.show()
