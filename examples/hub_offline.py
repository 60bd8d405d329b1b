"""
A Hub checkpoint on a machine without network
=============================================

On a connected machine, download a checkpoint once, into the Hugging Face cache or into
a folder you can copy::

    transformer-gmm download org/name                  # into the cache (HF_HOME)
    transformer-gmm download org/name --to my-model    # into a folder

On the offline machine, either point ``HF_HOME`` at the copied cache and set
``HF_HUB_OFFLINE=1`` (then ``checkpoint="org/name@<commit>"`` loads with no network at
all), or pass the folder itself. This example plays both sides with a checkpoint it
exports, since it must not reach the network: the folder is what ``download --to``
writes, and loading it needs nothing but the files. The figure shows the data with the
density of the mixture fitted offline.
"""

import os
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from transformer_gmm import TransformerGMM
from transformer_gmm.cli import main as transformer_gmm_command

os.environ["HF_HUB_OFFLINE"] = "1"  # any attempt to reach the Hub would now fail loudly

with tempfile.TemporaryDirectory() as root:
    folder = Path(root) / "my-model"
    # Stands in for `transformer-gmm download org/name --to my-model` on a connected machine.
    transformer_gmm_command(["export", "--preset", "tiny", "--to", str(folder)])
    transformer_gmm_command(["info", str(folder)])

    rng = np.random.default_rng(0)
    X = np.vstack([rng.normal(c, 1.0, (100, 2)) for c in ([-5, 0], [5, 0])])
    gmm = TransformerGMM(2, checkpoint=str(folder), random_state=0).fit(X)
    print("fitted offline from", folder.name, "- initialised by:", gmm.init_method_)

fig, ax = plt.subplots(figsize=(6, 4))
ax.scatter(*X.T, c=gmm.predict(X), s=8, cmap="viridis")
grid_x, grid_y = np.meshgrid(np.linspace(-9, 9, 200), np.linspace(-4, 4, 100))
log_density = gmm.score_samples(np.column_stack([grid_x.ravel(), grid_y.ravel()]))
ax.contour(grid_x, grid_y, log_density.reshape(grid_x.shape), levels=10, colors="gray",
           linestyles="solid")
ax.set(title="Mixture fitted offline, with its log-density", aspect="equal")
fig.tight_layout()
plt.show()
