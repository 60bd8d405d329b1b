"""
TransformerGMM beside GaussianMixture and KMeans
================================================

The same data, three estimators: the mixture estimators draw one ellipse per component
(two standard deviations along each principal axis of its covariance), the clusterers
colour the points by label.
"""

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Ellipse
from sklearn.cluster import KMeans
from sklearn.mixture import GaussianMixture

from transformer_gmm import TransformerClusterer, TransformerGMM

# Three anisotropic, overlapping clusters.
rng = np.random.default_rng(0)
covariances = [[[2.0, 1.2], [1.2, 1.5]], [[1.0, -0.6], [-0.6, 0.8]], [[0.5, 0.0], [0.0, 2.5]]]
centers = [[-3.0, 0.0], [2.0, 2.5], [3.0, -2.5]]
X = np.vstack(
    [rng.multivariate_normal(c, s, 200) for c, s in zip(centers, covariances, strict=True)]
)

estimators = {
    "TransformerGMM": TransformerGMM(3, random_state=0),
    "GaussianMixture": GaussianMixture(3, random_state=0),
    "TransformerClusterer": TransformerClusterer(3, random_state=0),
    "KMeans": KMeans(3, n_init=10, random_state=0),
}

fig, axes = plt.subplots(1, 4, figsize=(16, 4.8), sharex=True, sharey=True)
for ax, (name, estimator) in zip(axes, estimators.items(), strict=True):
    labels = estimator.fit_predict(X)
    ax.scatter(X[:, 0], X[:, 1], c=labels, s=6, cmap="viridis")
    if hasattr(estimator, "covariances_"):
        for mean, covariance in zip(estimator.means_, estimator.covariances_, strict=True):
            eigenvalues, eigenvectors = np.linalg.eigh(covariance)
            angle = np.degrees(np.arctan2(eigenvectors[1, 1], eigenvectors[0, 1]))
            width, height = 4 * np.sqrt(eigenvalues[::-1])
            ax.add_patch(Ellipse(mean, width, height, angle=angle, fill=False, color="red"))
        summary = f"mean log-likelihood {estimator.score(X):.3f}"
    else:
        ax.scatter(*estimator.cluster_centers_.T, marker="x", color="red", s=80)
        summary = f"inertia {estimator.inertia_:.0f}"
    ax.set_title(f"{name}\n{summary}")
    print(f"{name:>20}: {summary}")
    ax.set_aspect("equal")
fig.tight_layout()
plt.show()
