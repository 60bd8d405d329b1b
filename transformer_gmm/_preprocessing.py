"""The map between the user's space and the model's input space (numpy only).

The backbone reads points of width ``d_max`` with zero mean and unit average variance
per coordinate. The training task sampler goes through :func:`fit_standardization`, one
dataset at a time; fitting goes through its batched torch twin,
:func:`transformer_gmm.engine.standardize.fit_standardization`, which ``tests/test_readout.py``
holds equal to this one, so the model sees at inference exactly the distribution it was
trained on.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Standardization:
    """An affine map ``z = basis.T @ (x - center) / scale``, zero-padded to ``d_max``.

    Attributes
    ----------
    center : ndarray of shape (n_features,)
        Mean of the data.
    scale : float
        One global scale: the root mean variance of the kept coordinates.
    basis : ndarray of shape (n_features, n_kept)
        Orthonormal columns: the top principal directions (see :func:`n_kept_directions`),
        where the component means live; all of them, in order of variance, when every
        feature is kept.
    d_max : int
        Width of the model's input.
    """

    center: np.ndarray
    scale: float
    basis: np.ndarray
    d_max: int

    def transform(self, X: np.ndarray) -> np.ndarray:
        """Map points of shape (n, n_features) to model inputs of shape (n, d_max)."""
        Z = np.zeros((X.shape[0], self.d_max), dtype=np.float32)
        Z[:, : self.basis.shape[1]] = ((X - self.center) @ self.basis) / self.scale
        return Z

    def inverse_transform_means(self, means: np.ndarray) -> np.ndarray:
        """Map model-space means of shape (K, d_max) back to shape (K, n_features)."""
        kept = means[:, : self.basis.shape[1]].astype(np.float64)
        return self.center + self.scale * kept @ self.basis.T


def n_kept_directions(
    n_features: int, n_components: int, d_max: int, noise_directions: int = 0
) -> int:
    """How many coordinates the model reads: all of them, or the top principal directions.

    The means of K components span an affine subspace of at most K - 1 dimensions, so
    when the data has more features than that, only the top ``K - 1 + noise_directions``
    principal directions (at most ``d_max``) are kept: every task then looks alike to the
    model, whatever its number of features, and the rest is noise that the EM polish
    handles in full space. A direction beyond the K - 1 holds (almost) only noise, and so
    shows the model how wide the components are, which the K - 1 alone confound with how
    far apart they lie; a checkpoint's config says how many such directions its model
    was trained to read.

    Examples
    --------
    >>> from transformer_gmm._preprocessing import n_kept_directions
    >>> n_kept_directions(2, 5, 9), n_kept_directions(128, 5, 9), n_kept_directions(8, 2, 9)
    (2, 4, 1)
    >>> n_kept_directions(2, 2, 9, noise_directions=1), n_kept_directions(128, 10, 9, 1)
    (2, 9)
    """
    return min(n_features, d_max, max(n_components - 1, 1) + noise_directions)


def fit_standardization(
    X: np.ndarray, d_max: int, n_components: int, noise_directions: int = 0
) -> Standardization:
    """Fit the translation, projection and global scale that bring ``X`` to model space.

    Parameters
    ----------
    X : ndarray of shape (n_samples, n_features)
        Data in the user's space.
    d_max : int
        Width of the model's input.
    n_components : int
        K. Data with more than ``n_kept_directions(n_features, K, d_max,
        noise_directions)`` features is projected onto that many principal directions.
    noise_directions : int, default=0
        Principal directions kept beyond the K - 1 (see :func:`n_kept_directions`).

    Returns
    -------
    Standardization
        The fitted map. Translating ``X`` by ``b`` and scaling it by ``a > 0`` changes
        ``center`` to ``a * center + b`` and ``scale`` to ``a * scale`` and leaves the
        transformed points unchanged, so the model's estimate is equivariant.
    """
    X = np.asarray(X, dtype=np.float64)
    n_features = X.shape[1]
    center = X.mean(axis=0)
    Xc = X - center
    n_kept = n_kept_directions(n_features, n_components, d_max, noise_directions)
    # The principal axes even when every feature is kept: the backbone is not rotation
    # equivariant, and a canonical orientation (largest variance first) is one thing less
    # for it to learn. Eigenvectors of the d x d covariance: O(n d^2) time and O(d^2)
    # memory, whatever n.
    eigenvalues, eigenvectors = np.linalg.eigh(Xc.T @ Xc / X.shape[0])
    order = np.argsort(eigenvalues)[::-1][:n_kept]
    basis = eigenvectors[:, order]
    # Fix each direction's sign (largest loading positive) so the map is deterministic.
    signs = np.sign(basis[np.abs(basis).argmax(axis=0), np.arange(n_kept)])
    basis = basis * np.where(signs == 0, 1.0, signs)
    variances = np.clip(eigenvalues[order], 0.0, None)
    scale = float(np.sqrt(variances.mean()))
    if not np.isfinite(scale) or scale <= np.finfo(np.float64).tiny:
        scale = 1.0  # all points coincide: any scale maps them to the origin
    return Standardization(center=center, scale=scale, basis=basis, d_max=d_max)
