"""Hsu & Kakade's moment method for mixtures of spherical Gaussians (numpy).

D. Hsu and S. M. Kakade, "Learning mixtures of spherical Gaussians: moment methods and
spectral decompositions", ITCS 2013; the tensor decomposition is the robust tensor power
method of Anandkumar, Ge, Hsu, Kakade and Telgarsky, "Tensor decompositions for learning
latent variable models", JMLR 2014 (Algorithm 1). The baseline the TGMM paper compares with.

For x = mu_h + sigma z, with h ~ weights and z ~ N(0, I), and m = E[x]:

- sigma^2 is the smallest eigenvalue of Cov(x): the centred means span at most K - 1
  directions, so any d >= K leaves a direction that holds noise only. This is the paper's
  estimator for d > K and the same argument covers d = K, so d = K needs no special case.
  We assume one variance shared by all components (the paper's general case, a variance
  per component, needs another first-moment correction we do not use: our tasks have unit
  noise). With few samples the smallest sample eigenvalue is biased low
  (Marchenko-Pastur), and it is 0 when N <= d: the method's weakness, reported as is.
- M2 = E[x x^T] - sigma^2 I = sum_i w_i mu_i mu_i^T.
- M3 = E[x (x) x (x) x] - sigma^2 sum_j (m (x) e_j (x) e_j + e_j (x) m (x) e_j
  + e_j (x) e_j (x) m) = sum_i w_i mu_i (x) mu_i (x) mu_i.
- W (d, K) from the top-K eigenpairs of M2, so that W^T M2 W = I; then
  T = M3(W, W, W) = sum_i lambda_i v_i^(x)3 with orthonormal v_i = sqrt(w_i) W^T mu_i and
  lambda_i = 1 / sqrt(w_i). T is formed in K dimensions from the whitened data y = W^T x
  (never a d^3 array): M3(W, W, W) = E[y (x) y (x) y] - sigma^2 (a (x) B + ...), with
  a = W^T m and B = W^T W.
- The power method finds each (lambda_i, v_i), deflating T after each; then
  w_i = 1 / lambda_i^2 and mu_i = lambda_i (W^T)^+ v_i.

The method needs the K means to be linearly independent, so d >= K; ``spectral_fit``
raises a ValueError otherwise and the benchmark scripts report "n/a".
"""

from __future__ import annotations

import numpy as np


def _check(X: np.ndarray, n_components: int) -> np.ndarray:
    X = np.asarray(X, dtype=float)
    n_samples, n_features = X.shape
    if n_features < n_components:
        raise ValueError(
            f"The spectral method needs n_features >= n_components (the means must be "
            f"linearly independent), got n_features={n_features} and "
            f"n_components={n_components}. Report it as not applicable, or use EM."
        )
    if n_samples < 2:
        raise ValueError(f"The spectral method needs at least 2 samples, got {n_samples}.")
    return X


def noise_variance(X: np.ndarray, n_components: int) -> float:
    """The shared noise variance: the smallest eigenvalue of the sample covariance.

    Parameters
    ----------
    X : ndarray of shape (n_samples, n_features)
        Samples, with n_features >= n_components.
    n_components : int
        The number of mixture components.

    Returns
    -------
    sigma2 : float
        The estimate of sigma^2 (0 or less when n_samples <= n_features).
    """
    X = _check(X, n_components)
    centred = X - X.mean(axis=0)
    return float(np.linalg.eigvalsh(centred.T @ centred / len(X))[0])


def whitening(X: np.ndarray, n_components: int, sigma2: float
              ) -> tuple[np.ndarray, np.ndarray]:
    """W with W^T M2 W = I from the top-K eigenpairs of M2, and (W^T)^+.

    Returns
    -------
    W : ndarray of shape (n_features, n_components)
    W_t_pinv : ndarray of shape (n_features, n_components)
        The pseudo-inverse of W^T, which maps whitened vectors back to R^d.
    """
    second = X.T @ X / len(X) - sigma2 * np.eye(X.shape[1])
    values, vectors = np.linalg.eigh(second)
    values, vectors = values[-n_components:], vectors[:, -n_components:]
    # Sampling error can leave the K-th eigenvalue at or below 0 when the means are
    # nearly dependent; a floor keeps W finite (the estimate is then poor, as it should be).
    values = np.maximum(values, 1e-12 * max(values.max(), 1e-12))
    return vectors / np.sqrt(values), vectors * np.sqrt(values)


def whitened_third_moment(X: np.ndarray, W: np.ndarray, sigma2: float) -> np.ndarray:
    """T = M3(W, W, W) of shape (K, K, K), from the whitened data (no d^3 array)."""
    Y = X @ W  # (n, K)
    a = Y.mean(axis=0)  # W^T m
    B = W.T @ W  # sum_j (W^T e_j)(W^T e_j)^T
    raw = np.einsum("ni,nj,nk->ijk", Y, Y, Y) / len(X)
    correction = (np.einsum("i,jk->ijk", a, B) + np.einsum("j,ik->ijk", a, B)
                  + np.einsum("k,ij->ijk", a, B))
    return raw - sigma2 * correction


def _power_iterations(T: np.ndarray, theta: np.ndarray, n_iter: int) -> np.ndarray:
    """theta <- T(I, theta, theta) / ||.||, for a batch of starts theta (L, K)."""
    for _ in range(n_iter):
        theta = np.einsum("ijk,lj,lk->li", T, theta, theta)
        norms = np.linalg.norm(theta, axis=1, keepdims=True)
        theta = theta / np.where(norms > 0, norms, 1.0)
    return theta


def robust_tensor_power(T: np.ndarray, rng: np.random.Generator, n_restarts: int = 10,
                        n_iter: int = 100) -> tuple[float, np.ndarray]:
    """One eigenpair of a symmetric K x K x K tensor (Anandkumar et al. 2014, Algorithm 1).

    ``n_restarts`` random unit starts run ``n_iter`` power iterations each (as a batch);
    the one with the largest T(theta, theta, theta) runs ``n_iter`` more.

    Returns
    -------
    eigenvalue : float
    eigenvector : ndarray of shape (K,)
    """
    starts = rng.standard_normal((n_restarts, T.shape[0]))
    starts /= np.linalg.norm(starts, axis=1, keepdims=True)
    theta = _power_iterations(T, starts, n_iter)
    values = np.einsum("ijk,li,lj,lk->l", T, theta, theta, theta)
    best = _power_iterations(T, theta[[np.argmax(values)]], n_iter)[0]
    return float(np.einsum("ijk,i,j,k->", T, best, best, best)), best


def spectral_fit(X: np.ndarray, n_components: int, rng: np.random.Generator | int | None,
                 n_restarts: int = 10, n_iter: int = 100) -> tuple[np.ndarray, np.ndarray]:
    """Weights and means of a spherical Gaussian mixture by Hsu & Kakade's moment method.

    Parameters
    ----------
    X : array-like of shape (n_samples, n_features)
        Samples, with n_features >= n_components.
    n_components : int
        The number of components K.
    rng : numpy Generator, int or None
        Draws the random starts of the power method.
    n_restarts : int, default=10
        Random starts per eigenpair (L in the paper).
    n_iter : int, default=100
        Power iterations per start, and again for the best start (N in the paper).

    Returns
    -------
    weights : ndarray of shape (n_components,)
        1 / lambda_i^2, normalised to sum to 1 (with sampling error they do not quite).
    means : ndarray of shape (n_components, n_features)

    Raises
    ------
    ValueError
        When n_features < n_components: the method does not apply.
    """
    X = _check(X, n_components)
    rng = np.random.default_rng(rng)
    sigma2 = noise_variance(X, n_components)
    W, W_t_pinv = whitening(X, n_components, sigma2)
    T = whitened_third_moment(X, W, sigma2)
    eigenvalues, eigenvectors = [], []
    for _ in range(n_components):
        value, vector = robust_tensor_power(T, rng, n_restarts, n_iter)
        T = T - value * np.einsum("i,j,k->ijk", vector, vector, vector)  # deflation
        eigenvalues.append(value)
        eigenvectors.append(vector)
    eigenvalues = np.array(eigenvalues)
    # A sign flip of v_i flips lambda_i too and leaves mu_i unchanged; only |lambda| ~ 0
    # (a component the tensor does not see) needs guarding.
    safe = np.where(np.abs(eigenvalues) > 1e-12, eigenvalues, 1e-12)
    weights = 1.0 / safe**2
    means = (safe[:, None] * np.array(eigenvectors)) @ W_t_pinv.T
    return weights / weights.sum(), means
