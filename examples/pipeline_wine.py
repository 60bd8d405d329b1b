"""
A pipeline on real data: scaling, PCA and a mixture
===================================================

The wine data shipped with scikit-learn (178 wines, 13 chemical measurements, 3
cultivars): standardize, keep 5 principal components, fit 3 components, and compare the
clusters with the cultivars (adjusted Rand index) for ``TransformerGMM`` and
``GaussianMixture`` in the same pipeline. The figure shows the wines on the first two of
those principal components, coloured by cultivar and by each pipeline's clusters.
"""

import matplotlib.pyplot as plt
from sklearn.datasets import load_wine
from sklearn.decomposition import PCA
from sklearn.metrics import adjusted_rand_score
from sklearn.mixture import GaussianMixture
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from transformer_gmm import TransformerGMM

X, cultivar = load_wine(return_X_y=True)
fig, axes = plt.subplots(1, 3, figsize=(13, 4.2), sharex=True, sharey=True)
for ax, mixture in zip(axes[1:], [TransformerGMM(3, covariance_type="diag", random_state=0),
                                  GaussianMixture(3, covariance_type="diag", random_state=0)],
                       strict=True):
    pipeline = make_pipeline(StandardScaler(), PCA(n_components=5), mixture)
    labels = pipeline.fit(X).predict(X)
    ari = adjusted_rand_score(cultivar, labels)
    print(f"{type(mixture).__name__:>16}: ARI against the cultivars {ari:.3f}, "
          f"mean log-likelihood {pipeline.score(X):.3f}")
    components = pipeline[:-1].transform(X)  # what the mixture sees: 5 principal components
    ax.scatter(components[:, 0], components[:, 1], c=labels, s=12, cmap="viridis")
    ax.set_title(f"{type(mixture).__name__}: ARI {ari:.3f}")
axes[0].scatter(components[:, 0], components[:, 1], c=cultivar, s=12, cmap="viridis")
axes[0].set(title="the three cultivars", xlabel="PC 1", ylabel="PC 2")
for ax in axes[1:]:
    ax.set_xlabel("PC 1")
fig.tight_layout()
plt.show()
