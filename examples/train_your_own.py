"""
Training a small checkpoint of your own
=======================================

Meta-train a tiny transformer on synthetic mixture tasks for a few dozen steps (seconds
on a CPU), then use the checkpoint folder it writes with ``TransformerGMM``. A useful
model needs far more steps, a larger preset and ideally a GPU::

    python -m transformer_gmm.training --preset small --device cuda

Every option of that command is a field of ``TrainConfig``. The figure shows the
training loss step by step (from the run's ``log.jsonl``) and the fits with the new
checkpoint.
"""

import json
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from transformer_gmm import TransformerGMM
from transformer_gmm.training.train import TrainConfig, train

with tempfile.TemporaryDirectory() as folder:
    config = TrainConfig(
        model="tiny",  # 1 layer, d_model 16: heads for K = 2..4, inputs of width 4
        prior="tiny",
        batch_size=8,
        max_steps=40,
        lr=3e-3,
        min_lr=3e-4,
        warmup_steps=5,
        eval_every=20,
        eval_tasks=4,
        save_every=20,
        out_dir=folder,
        threads=1,
    )
    run = train(config)  # the run folder: state.pt (to resume), log.jsonl, checkpoint/
    checkpoint = Path(run) / "checkpoint"  # config.json, model.safetensors, README.md
    print("checkpoint files:", sorted(path.name for path in checkpoint.iterdir()))
    log = [json.loads(line) for line in (Path(run) / "log.jsonl").read_text().splitlines()]

    fig, (loss_ax, data_ax) = plt.subplots(1, 2, figsize=(11, 4))
    loss_ax.plot([record["step"] for record in log], [record["loss"] for record in log])
    loss_ax.set(xlabel="step", ylabel="training loss", title="Meta-training, 40 steps")

    rng = np.random.default_rng(0)
    X = np.vstack([rng.normal(c, 1.0, (100, 2)) for c in ([-5, 0], [5, 0], [0, 6])])
    # Forty steps make a poor initialiser: EM from its start can stop in a local optimum.
    # n_init=3 adds the transformer's second start (its per-point labels) and a k-means++
    # start; a fit from k-means++ is kept where it is likelier by more than 5 nats.
    for n_init in (1, 3):
        gmm = TransformerGMM(3, checkpoint=str(checkpoint), n_init=n_init, random_state=0)
        gmm.fit(X)
        means = np.round(gmm.means_[np.argsort(gmm.means_[:, 0])], 1).tolist()
        print(f"n_init={n_init}: kept the {gmm.init_method_} start, "
              f"lower bound {gmm.lower_bound_:.3f}, means {means}")
        data_ax.scatter(*gmm.means_.T, marker="x" if n_init == 1 else "+", s=200, lw=3,
                        zorder=3, label=f"n_init={n_init}: {gmm.init_method_} start")
    data_ax.scatter(*X.T, s=6, color="lightgray")
    data_ax.set(title="Means fitted from the new checkpoint", aspect="equal")
    data_ax.legend()
    fig.tight_layout()
    plt.show()
