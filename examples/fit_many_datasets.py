"""
Many small datasets at once
===========================

``fit_many`` fits one mixture per dataset with one forward pass of the transformer and one
batched EM for all of them; datasets may differ in size (they are padded and masked).
The figure shows the datasets fitted per second against the number of datasets in one
call, beside a loop of ``TransformerGMM().fit`` and a loop of scikit-learn's
``GaussianMixture().fit`` on the first 8 of the same datasets.
"""

import os
import time

import matplotlib.pyplot as plt
import numpy as np
from sklearn.mixture import GaussianMixture

from transformer_gmm import TransformerGMM, fit_many

# 1, 4, 16 and 64 datasets in one call (up to 16 in the test suite's quick run).
quick = bool(os.environ.get("TRANSFORMER_GMM_EXAMPLES_QUICK"))
batch_sizes = 4 ** np.arange(3 if quick else 4)

rng = np.random.default_rng(0)
datasets = []
for _ in range(batch_sizes[-1]):
    means = rng.uniform(-5, 5, (3, 4))
    n_samples = rng.integers(60, 200)
    datasets.append(means[rng.integers(0, 3, n_samples)] + rng.standard_normal((n_samples, 4)))

# The first call in a process loads the checkpoint; time the calls after it.
fit_many(datasets[:2], 3, covariance_type="spherical", random_state=0)

rates = []
for size in batch_sizes:
    start = time.perf_counter()
    batch = fit_many(datasets[:size], 3, covariance_type="spherical", random_state=0)
    rates.append(size / (time.perf_counter() - start))
    print(f"fit_many on {size:3d} datasets: {rates[-1]:6.0f} datasets/s")

# The first datasets again, one fit at a time: ours, then scikit-learn's. A rate needs
# only a few of them.
few = datasets[: 4 if quick else 8]
start = time.perf_counter()
loop = [TransformerGMM(3, covariance_type="spherical", random_state=0).fit(X) for X in few]
loop_rate = len(few) / (time.perf_counter() - start)
start = time.perf_counter()
for X in few:
    GaussianMixture(3, covariance_type="spherical", random_state=0).fit(X)
sklearn_rate = len(few) / (time.perf_counter() - start)
print(f"a loop of TransformerGMM().fit:  {loop_rate:6.0f} datasets/s")
print(f"a loop of GaussianMixture().fit: {sklearn_rate:6.0f} datasets/s")
gaps = [abs(a.lower_bound_ - b.lower_bound_) for a, b in zip(batch[: len(few)], loop, strict=True)]
print(f"fit_many and the loop: the same lower bound (to 1e-3) for "
      f"{np.mean(np.array(gaps) < 1e-3):.0%} of the {len(few)} datasets")

# For many thousands of datasets, ``output="arrays"`` skips building an estimator per
# dataset and returns the parameters stacked: row i is dataset i.
arrays = fit_many(datasets, 3, covariance_type="spherical", random_state=0, output="arrays")
print(
    f"arrays: means {arrays.means.shape}, from the transformer: "
    f"{np.mean(arrays.init_method == 'transformer'):.0%}"
)

fig, ax = plt.subplots(figsize=(6, 4))
ax.plot(batch_sizes, rates, marker="o", label="fit_many (one call)")
ax.axhline(loop_rate, color="gray", linestyle="--", label="a loop of TransformerGMM().fit")
ax.axhline(sklearn_rate, color="gray", linestyle=":", label="a loop of GaussianMixture().fit")
ax.set(xscale="log", ylim=(0, None), xlabel="datasets in one call",
       ylabel="datasets fitted per second", title="Throughput against batch size, on this machine")
ax.legend()
fig.tight_layout()
plt.show()
