"""
Choosing the number of components: cross-validation and BIC
===========================================================

``GridSearchCV`` compares ``TransformerGMM`` with ``GaussianMixture`` over
``n_components`` and ``covariance_type`` with their default score (the mean held-out
log-likelihood), and BIC picks K on the whole data, as in scikit-learn's own
model-selection example. Saves ``model_selection.png``.
"""


import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from sklearn.mixture import GaussianMixture
from sklearn.model_selection import GridSearchCV

from transformer_gmm import TransformerGMM

rng = np.random.default_rng(1)
centers = [[-6.0, 0.0, 0.0], [0.0, 6.0, 0.0], [6.0, 0.0, 0.0], [0.0, -6.0, 3.0]]
X = np.vstack([rng.normal(c, 1.0, (100, 3)) for c in centers])

grid = {"n_components": range(1, 7), "covariance_type": ["spherical", "diag", "full"]}
for estimator in [TransformerGMM(random_state=0), GaussianMixture(random_state=0)]:
    search = GridSearchCV(estimator, grid).fit(X)
    print(f"{type(estimator).__name__:>16}: best {search.best_params_}, "
          f"held-out log-likelihood {search.best_score_:.3f}")

bics = {
    covariance_type: [
        TransformerGMM(k, covariance_type=covariance_type, random_state=0).fit(X).bic(X)
        for k in grid["n_components"]
    ]
    for covariance_type in grid["covariance_type"]
}
best_type = min(bics, key=lambda t: min(bics[t]))
best_k = grid["n_components"][int(np.argmin(bics[best_type]))]
print(f"BIC picks K = {best_k} with covariance_type={best_type!r}")

fig, ax = plt.subplots(figsize=(6, 4))
for covariance_type, values in bics.items():
    ax.plot(list(grid["n_components"]), values, marker="o", label=covariance_type)
ax.set(xlabel="n_components", ylabel="BIC (lower is better)", title="TransformerGMM")
ax.legend()
fig.tight_layout()
fig.savefig("model_selection.png", dpi=100)
print("saved model_selection.png")
