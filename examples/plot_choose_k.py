"""
Choosing the number of components
=================================

``TransformerGMM(n_components="auto")`` reads the checkpoint's P(K | X) for K = 1..10 in
one forward pass and fits the most probable K (``k_posterior_`` holds the posterior).
``criterion="bic"`` instead fits every K and keeps the lowest BIC, the loop
scikit-learn's model-selection example writes by hand. ``TransformerClusterer`` takes
``n_clusters="auto"`` the same way. The figure shows the data coloured by the chosen fit,
the BIC of every candidate and the posterior over K. On these five well-separated
clusters both find five; where components overlap, the posterior finds the true K more
often (see "Choosing the number of components" in the documentation).
"""

import matplotlib.pyplot as plt
import numpy as np

from transformer_gmm import TransformerClusterer, TransformerGMM

rng = np.random.default_rng(0)
centers = np.array([[-4.0, -3.0], [0.0, 3.5], [4.5, -2.0], [5.0, 5.0], [-5.0, 4.0]])
X = np.vstack([rng.normal(c, 1.0, (80, 2)) for c in centers])

gmm = TransformerGMM(n_components="auto", random_state=0).fit(X)
print(f"the most probable K under P(K | X): K = {gmm.n_components_}")
for k, p in zip(gmm.candidates_, gmm.k_posterior_, strict=True):
    print(f"  P(K = {k:2d} | X) = {p:.3f}")
by_bic = TransformerGMM(n_components="auto", criterion="bic", random_state=0).fit(X)
print(f"BIC over the fits of K = 1..10: K = {by_bic.n_components_}")

clusterer = TransformerClusterer(n_clusters="auto", random_state=0).fit(X)
print(f"TransformerClusterer(n_clusters='auto'): K = {clusterer.n_clusters_}")

fig, (data_ax, bic_ax, posterior_ax) = plt.subplots(1, 3, figsize=(13, 4))
data_ax.scatter(*X.T, c=gmm.predict(X), s=8, cmap="tab10")
data_ax.scatter(*gmm.means_.T, c="black", marker="x", s=60)
data_ax.set(title=f"TransformerGMM(n_components='auto'): K = {gmm.n_components_}")
bic_ax.plot(by_bic.candidates_, by_bic.criterion_, marker="o", color="tab:orange")
bic_ax.set(xlabel="K", ylabel="BIC (lower is better)", title="criterion='bic'",
           xticks=by_bic.candidates_)
posterior_ax.bar(gmm.candidates_, gmm.k_posterior_, color="tab:blue")
posterior_ax.set(xlabel="K", ylabel="P(K | X)", title="P(K | X): criterion='auto' (default)",
                 xticks=gmm.candidates_)
fig.tight_layout()
plt.show()
