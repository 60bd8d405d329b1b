"""The front page's figure: what each entry point gives, on data drawn here and fitted with
the bundled checkpoint. Run by the plot directive in index.md at every docs build."""

import matplotlib.pyplot as plt
import numpy as np

from transformer_gmm import TransformerClusterer, TransformerGMM, fit_many

rng = np.random.default_rng(3)
colors = np.array([[0.27, 0.47, 0.67], [0.87, 0.53, 0.2], [0.33, 0.65, 0.4]])
centers = np.array([[-2.0, 0.0], [1.2, 1.6], [1.5, -1.6]])
X = np.vstack([rng.normal(c, 1.0, (150, 2)) for c in centers])
grid_x, grid_y = np.meshgrid(np.linspace(-6, 5.5, 200), np.linspace(-5, 5, 200))
grid = np.column_stack([grid_x.ravel(), grid_y.ravel()])

fig = plt.figure(figsize=(12, 3.9), layout="constrained")
gmm_ax, clusterer_ax, many = fig.subfigures(1, 3, width_ratios=[1, 1, 1.05])
gmm_ax, clusterer_ax = gmm_ax.subplots(), clusterer_ax.subplots()

# TransformerGMM: every point's colour mixes the components' colours by its
# responsibilities (predict_proba); the lines are levels of the density (score_samples).
gmm = TransformerGMM(3, random_state=0).fit(X)
gmm_ax.scatter(*X.T, s=9, c=np.clip(gmm.predict_proba(X) @ colors, 0, 1))
gmm_ax.contour(grid_x, grid_y, gmm.score_samples(grid).reshape(grid_x.shape),
               levels=np.linspace(-9, -3.5, 6), colors="0.3", linewidths=0.8,
               linestyles="solid")
gmm_ax.set_title("TransformerGMM\nsoft assignments and a density")

# TransformerClusterer: one label per point, and the regions predict assigns.
clusterer = TransformerClusterer(3, random_state=0).fit(X)
regions = clusterer.predict(grid).reshape(grid_x.shape)
clusterer_ax.contourf(grid_x, grid_y, regions, levels=[-0.5, 0.5, 1.5, 2.5],
                      colors=[(*c, 0.15) for c in colors])
clusterer_ax.scatter(*X.T, s=9, c=colors[clusterer.labels_])
clusterer_ax.scatter(*clusterer.cluster_centers_.T, marker="x", s=90, lw=2.5, color="black")
clusterer_ax.set_title("TransformerClusterer\nhard labels and centres")

# fit_many: nine small datasets of different sizes, one call, one mixture each.
angles = rng.uniform(0, 2 * np.pi, 9)[:, None] + [0, 2 * np.pi / 3, 4 * np.pi / 3]
datasets = [np.vstack([rng.normal(3 * np.array([np.cos(a), np.sin(a)]), 0.8,
                                  (rng.integers(10, 40), 2)) for a in row]) for row in angles]
for ax, data, fitted in zip(many.subplots(3, 3).ravel(), datasets,
                            fit_many(datasets, 3, random_state=0), strict=True):
    ax.scatter(*data.T, s=3, c=colors[fitted.predict(data)])
    ax.scatter(*fitted.means_.T, marker="x", s=25, lw=1.5, color="black")
    ax.set(xticks=[], yticks=[])
many.suptitle("fit_many\nmany small datasets, one call", fontsize="large")

for ax in (gmm_ax, clusterer_ax):
    ax.set(xlim=(-6, 5.5), ylim=(-5, 5), xticks=[], yticks=[], aspect="equal")
