"""
Choosing the number of components: cross-validation and BIC
===========================================================

``GridSearchCV`` compares ``TransformerGMM`` with ``GaussianMixture`` over
``n_components`` with their default score (the mean held-out log-likelihood, here over 3
folds), and BIC picks K and ``covariance_type`` on the whole data, as in scikit-learn's own
model-selection example. The figure shows both criteria against ``n_components``.
"""

import os

import matplotlib.pyplot as plt
import numpy as np
from sklearn.mixture import GaussianMixture
from sklearn.model_selection import GridSearchCV, KFold

from transformer_gmm import TransformerGMM

rng = np.random.default_rng(1)
centers = [[-6.0, 0.0, 0.0], [0.0, 6.0, 0.0], [6.0, 0.0, 0.0], [0.0, -6.0, 3.0]]
X = np.vstack([rng.normal(c, 1.0, (100, 3)) for c in centers])

# Four clusters: K from 2 to 6 (3 to 5 in the test suite's quick run).
n_components = range(3, 6) if os.environ.get("TRANSFORMER_GMM_EXAMPLES_QUICK") else range(2, 7)
covariance_types = ["spherical", "diag", "full"]
grid = {"n_components": n_components}
# The rows are in cluster order: shuffle them into the folds, so that no fold holds out a
# whole cluster.
folds = KFold(3, shuffle=True, random_state=0)
fig, (cv_ax, bic_ax) = plt.subplots(1, 2, figsize=(11, 4))
for estimator in [TransformerGMM(random_state=0), GaussianMixture(random_state=0)]:
    search = GridSearchCV(estimator, grid, cv=folds).fit(X)
    print(f"{type(estimator).__name__:>16}: best {search.best_params_}, "
          f"held-out log-likelihood {search.best_score_:.3f}")
    cv_ax.plot(list(search.cv_results_["param_n_components"]),
               search.cv_results_["mean_test_score"], marker="o",
               label=type(estimator).__name__)
cv_ax.set(xlabel="n_components", ylabel="held-out log-likelihood (higher is better)",
          title="3-fold cross-validation, full covariances")
cv_ax.legend()

bics = {
    covariance_type: [
        TransformerGMM(k, covariance_type=covariance_type, random_state=0).fit(X).bic(X)
        for k in n_components
    ]
    for covariance_type in covariance_types
}
best_type = min(bics, key=lambda t: min(bics[t]))
best_k = n_components[int(np.argmin(bics[best_type]))]
print(f"BIC picks K = {best_k} with covariance_type={best_type!r}")

for covariance_type, values in bics.items():
    bic_ax.plot(list(n_components), values, marker="o", label=covariance_type)
bic_ax.set(xlabel="n_components", ylabel="BIC (lower is better)", title="TransformerGMM's BIC")
bic_ax.legend(title="covariance_type")
fig.tight_layout()
plt.show()
