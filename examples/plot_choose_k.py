"""
Choosing the number of components in one pass
=============================================

``TransformerGMM(n_components="auto")`` reads P(K | X), the probability of each number
of components given the data, from the checkpoint in one forward pass, and fits the most
probable K. ``criterion="bic"`` instead fits every candidate and keeps the lowest BIC, as
scikit-learn's model-selection example does by hand. ``TransformerClusterer`` takes
``n_clusters="auto"`` the same way. The figure shows the data coloured by the chosen fit,
the posterior over K, and the BIC of every candidate.
"""

import matplotlib.pyplot as plt
import numpy as np

from transformer_gmm import TransformerClusterer, TransformerGMM

rng = np.random.default_rng(0)
centers = np.array([[-4.0, -3.0], [0.0, 3.5], [4.5, -2.0], [5.0, 5.0], [-5.0, 4.0]])
X = np.vstack([rng.normal(c, 1.0, (80, 2)) for c in centers])

gmm = TransformerGMM(n_components="auto", random_state=0).fit(X)
print(f"posterior: K = {gmm.n_components_} (chosen by {gmm.selection_criterion_!r})")
for k, p in zip(gmm.candidates_, gmm.k_posterior_, strict=True):
    print(f"  P(K = {k:2d} | X) = {p:.3f}")

by_bic = TransformerGMM(n_components="auto", criterion="bic", random_state=0).fit(X)
print(f"BIC over the fits of K = 1..10: K = {by_bic.n_components_}")

clusterer = TransformerClusterer(n_clusters="auto", random_state=0).fit(X)
print(f"TransformerClusterer: K = {clusterer.n_clusters_}")

fig, (data_ax, posterior_ax, bic_ax) = plt.subplots(1, 3, figsize=(13, 4))
data_ax.scatter(*X.T, c=gmm.predict(X), s=8, cmap="tab10")
data_ax.scatter(*gmm.means_.T, c="black", marker="x", s=60)
data_ax.set(title=f"TransformerGMM(n_components='auto'): K = {gmm.n_components_}")
posterior_ax.bar(gmm.candidates_, gmm.k_posterior_, color="tab:blue")
posterior_ax.set(xlabel="K", ylabel="P(K | X)", title="the checkpoint's posterior over K",
                 xticks=gmm.candidates_)
bic_ax.plot(by_bic.candidates_, by_bic.criterion_, marker="o", color="tab:orange")
bic_ax.set(xlabel="K", ylabel="BIC (lower is better)", title="criterion='bic'",
           xticks=by_bic.candidates_)
fig.tight_layout()
plt.show()
