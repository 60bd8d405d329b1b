"""
A pipeline on real data: scaling, PCA and a mixture
===================================================

The wine data shipped with scikit-learn (178 wines, 13 chemical measurements, 3
cultivars): standardize, keep 5 principal components, fit 3 components, and compare the
clusters with the cultivars (adjusted Rand index) for ``TransformerGMM`` and
``GaussianMixture`` in the same pipeline.
"""


from sklearn.datasets import load_wine
from sklearn.decomposition import PCA
from sklearn.metrics import adjusted_rand_score
from sklearn.mixture import GaussianMixture
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from transformer_gmm import TransformerGMM

X, cultivar = load_wine(return_X_y=True)
for mixture in [TransformerGMM(3, covariance_type="diag", random_state=0),
                GaussianMixture(3, covariance_type="diag", random_state=0)]:
    pipeline = make_pipeline(StandardScaler(), PCA(n_components=5), mixture)
    labels = pipeline.fit(X).predict(X)
    print(f"{type(mixture).__name__:>16}: ARI against the cultivars "
          f"{adjusted_rand_score(cultivar, labels):.3f}, "
          f"mean log-likelihood {pipeline.score(X):.3f}")
