"""
Fitting data with missing values
================================

``GaussianMixture`` refuses ``NaN``, so the usual recipe is to impute first, and imputed
values bias the fit: each filled entry sits at its column's mean, which pulls every
component's mean towards the centre and squeezes its covariance. ``TransformerGMM``
takes ``NaN`` as a missing entry: EM runs on the observed entries alone (Ghahramani and
Jordan, 1994), each row weighed by the density of the features it has, and ``predict``
and ``score_samples`` read the same marginals. Nothing is imputed except where the
transformer reads the rows to start EM.

The left panel shows the two fits on a table with 30 % of its entries missing; the right
one, how far the fitted means land from the true ones as more goes missing.

    python examples/plot_missing_values.py
"""

import os

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Ellipse
from sklearn.impute import SimpleImputer
from sklearn.mixture import GaussianMixture
from sklearn.pipeline import make_pipeline

from transformer_gmm import TransformerGMM

MEANS = np.array([[-4.0, 0.0, 0.0, 0.0], [2.0, 4.0, 0.0, 2.0], [3.0, -3.0, 3.0, -2.0]])
COVARIANCE = 0.6 * np.eye(4) + 0.4  # correlated: the observed features predict the rest


def table_with_gaps(rate: float, seed: int, n_per_component: int = 400):
    """Rows of three correlated Gaussians in 4-D, with ``rate`` of the entries missing
    completely at random (no row left empty)."""
    rng = np.random.default_rng(seed)
    X = np.vstack([rng.multivariate_normal(m, COVARIANCE, n_per_component) for m in MEANS])
    gaps = rng.random(X.shape) < rate
    gaps[gaps.all(axis=1), 0] = False
    return X, np.where(gaps, np.nan, X)


def mean_error(means: np.ndarray) -> float:
    """The largest distance from a true mean to the fitted mean nearest to it."""
    return float(np.linalg.norm(MEANS[:, None] - means[None], axis=-1).min(axis=1).max())


def draw_ellipses(ax, means, covariances, **style):
    for mean, covariance in zip(means[:, :2], covariances[:, :2, :2], strict=True):
        values, vectors = np.linalg.eigh(covariance)
        angle = np.degrees(np.arctan2(vectors[1, 1], vectors[0, 1]))
        width, height = 4 * np.sqrt(values[::-1])  # two standard deviations
        ax.add_patch(Ellipse(mean, width, height, angle=angle, fill=False, lw=2, **style))


def main() -> None:
    quick = bool(os.environ.get("TRANSFORMER_GMM_EXAMPLES_QUICK"))
    seeds = [0] if quick else [0, 1, 2, 3, 4]
    rates = [0.1, 0.3, 0.5] if quick else [0.0, 0.1, 0.2, 0.3, 0.4, 0.5]

    X, X_gaps = table_with_gaps(0.3, seed=0)
    ours = TransformerGMM(3, random_state=0).fit(X_gaps)  # NaN taken as they are
    imputed = make_pipeline(SimpleImputer(), GaussianMixture(3, random_state=0)).fit(X_gaps)
    theirs = imputed[-1]
    print(f"30 % missing: largest error of a fitted mean {mean_error(ours.means_):.2f} "
          f"(TransformerGMM) against {mean_error(theirs.means_):.2f} (mean imputation, "
          f"then GaussianMixture)")
    held_out = table_with_gaps(0.3, seed=99)[1]  # new rows with gaps: scored as observed
    print(f"log-likelihood of new rows' observed entries: {ours.score(held_out):.3f}")

    errors = {"TransformerGMM": [], "SimpleImputer + GaussianMixture": []}
    for rate in rates:
        for name in errors:
            per_seed = []
            for seed in seeds:
                _, gapped = table_with_gaps(rate, seed)
                if name == "TransformerGMM":
                    model = TransformerGMM(3, random_state=seed).fit(gapped)
                else:
                    pipeline = make_pipeline(SimpleImputer(), GaussianMixture(3, random_state=seed))
                    model = pipeline.fit(gapped)[-1]
                per_seed.append(mean_error(model.means_))
            errors[name].append(np.mean(per_seed))

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.5))
    complete = ~np.isnan(X_gaps[:, :2]).any(axis=1)
    left.scatter(*X[complete, :2].T, s=4, color="lightgray", label="rows (features 0, 1)")
    draw_ellipses(left, ours.means_, ours.covariances_, color="C0")
    draw_ellipses(left, theirs.means_, theirs.covariances_, color="C1", ls="--")
    left.scatter(*MEANS[:, :2].T, marker="x", s=80, color="black", label="true means")
    left.plot([], [], color="C0", label="TransformerGMM on the NaN")
    left.plot([], [], color="C1", ls="--", label="mean imputation, then GaussianMixture")
    left.set(title="30 % of the entries missing", xlabel="x0", ylabel="x1", aspect="equal")
    left.legend(loc="upper left", fontsize=8)
    for (name, values), style in zip(errors.items(), ("-o", "--s"), strict=True):
        right.plot(100 * np.array(rates), values, style, label=name)
    right.set(xlabel="entries missing (%)", ylabel="largest error of a fitted mean",
              title=f"Mean over {len(seeds)} {'draws' if len(seeds) > 1 else 'draw'} a rate")
    right.legend(loc="upper left")
    fig.tight_layout()
    plt.show()


if __name__ == "__main__":
    main()
