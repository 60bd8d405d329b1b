"""Array API dispatch: with scikit-learn's ``array_api_dispatch`` on, torch tensors and
``array-api-strict`` arrays come in, and the fitted parameters and results go back in
their namespace and on their device, equal to the fit of their numpy copy. Without
dispatch, numpy in and numpy out, as always."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import sklearn
import torch
from numpy.testing import assert_allclose, assert_array_equal

from transformer_gmm import TransformerClusterer, TransformerGMM, _array_api

COVARIANCE_TYPES = ["full", "tied", "diag", "spherical"]
MIXTURE_ARRAYS = ("weights_", "means_", "covariances_", "precisions_", "precisions_cholesky_")


@pytest.fixture
def dispatch(monkeypatch):
    """scikit-learn's array_api_dispatch on. scikit-learn asks for SCIPY_ARRAY_API=1 before
    it turns dispatch on; the estimators hand scipy numpy arrays only, so setting it
    after scipy's import is enough here."""
    monkeypatch.setenv("SCIPY_ARRAY_API", "1")
    with sklearn.config_context(array_api_dispatch=True):
        yield


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # convergence on small data is not what is tested
        yield


def _blobs(dtype=np.float64) -> np.ndarray:
    rng = np.random.default_rng(0)
    X = np.vstack([rng.normal(-4, 1, (60, 3)), rng.normal(4, 1.5, (60, 3))])
    return X.astype(dtype)


def _gmm(covariance_type="full", **params) -> TransformerGMM:
    params = {"checkpoint": None, "random_state": 0, **params}
    return TransformerGMM(2, covariance_type=covariance_type, **params)


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_torch_mixture_equals_numpy_fit(dispatch, covariance_type):
    X = _blobs()
    reference = _gmm(covariance_type).fit(X)
    tensor = torch.from_numpy(X)
    gmm = _gmm(covariance_type).fit(tensor)
    for name in MIXTURE_ARRAYS:
        value = getattr(gmm, name)
        assert isinstance(value, torch.Tensor), name
        assert value.device == tensor.device
        assert_allclose(value.numpy(), getattr(reference, name), rtol=1e-12, atol=1e-12)
    assert isinstance(gmm.collapsed_components_, torch.Tensor)
    outputs = {
        "predict": (gmm.predict(tensor), reference.predict(X)),
        "predict_proba": (gmm.predict_proba(tensor), reference.predict_proba(X)),
        "score_samples": (gmm.score_samples(tensor), reference.score_samples(X)),
        "sample": (gmm.sample(5)[0], reference.sample(5)[0]),
        "sample labels": (gmm.sample(5)[1], reference.sample(5)[1]),
        "fit_predict": (_gmm(covariance_type).fit_predict(tensor), reference.predict(X)),
    }
    for name, (ours, expected) in outputs.items():
        assert isinstance(ours, torch.Tensor), name
        assert_allclose(ours.numpy(), expected, rtol=1e-12, atol=1e-12, err_msg=name)
    for method in ("score", "bic", "aic"):
        value = getattr(gmm, method)(tensor)
        assert isinstance(value, float)
        assert value == pytest.approx(getattr(reference, method)(X), rel=1e-12)
    weights = np.linspace(0.5, 2.0, len(X))
    assert gmm.score(tensor, sample_weight=torch.from_numpy(weights)) == pytest.approx(
        reference.score(X, sample_weight=weights), rel=1e-12
    )


def test_torch_float32_keeps_dtype(dispatch):
    X = _blobs(np.float32)
    gmm = _gmm("diag").fit(torch.from_numpy(X))
    assert gmm.means_.dtype == torch.float32
    assert gmm.predict_proba(torch.from_numpy(X)).dtype == torch.float32
    assert_allclose(gmm.means_.numpy(), _gmm("diag").fit(X).means_, rtol=1e-6)


def test_torch_weights_and_init_arrays(dispatch):
    """sample_weight and the *_init parameters may be tensors too."""
    X = _blobs()
    weights = np.linspace(0.5, 2.0, len(X))
    means = np.array([[-4.0, -4.0, -4.0], [4.0, 4.0, 4.0]])
    reference = _gmm(means_init=means).fit(X, sample_weight=weights)
    gmm = _gmm(means_init=torch.from_numpy(means))
    gmm.fit(torch.from_numpy(X), sample_weight=torch.from_numpy(weights))
    assert_allclose(gmm.means_.numpy(), reference.means_, rtol=1e-12)
    assert isinstance(gmm.means_init, torch.Tensor)  # the parameter is left as given


@pytest.mark.parametrize("init_params", ["kmeans", "k-means++"])
def test_kmeans_starts_supported_with_dispatch(dispatch, init_params):
    """GaussianMixture raises NotImplementedError for these with dispatch on; these
    starts run here, on the numpy copy, as without dispatch."""
    X = _blobs()
    reference = _gmm(init_params=init_params).fit(X)
    gmm = _gmm(init_params=init_params).fit(torch.from_numpy(X))
    assert isinstance(gmm.means_, torch.Tensor)
    assert_allclose(gmm.means_.numpy(), reference.means_, rtol=1e-12)


def test_warm_start_from_torch_fit(dispatch):
    X = torch.from_numpy(_blobs())
    gmm = _gmm(warm_start=True, max_iter=2).fit(X)
    gmm.fit(X)
    assert gmm.init_method_ == "warm_start"
    assert isinstance(gmm.means_, torch.Tensor)


def test_torch_clusterer_equals_numpy_fit(dispatch):
    X = _blobs()
    reference = TransformerClusterer(2, checkpoint=None, random_state=0).fit(X)
    tensor = torch.from_numpy(X)
    km = TransformerClusterer(2, checkpoint=None, random_state=0).fit(tensor)
    assert isinstance(km.cluster_centers_, torch.Tensor)
    assert isinstance(km.labels_, torch.Tensor)
    assert_allclose(km.cluster_centers_.numpy(), reference.cluster_centers_, rtol=1e-12)
    assert_array_equal(km.labels_.numpy(), reference.labels_)
    assert km.inertia_ == pytest.approx(reference.inertia_, rel=1e-12)
    for name, ours, expected in [
        ("predict", km.predict(tensor), reference.predict(X)),
        ("transform", km.transform(tensor), reference.transform(X)),
        ("fit_predict", km.fit_predict(tensor), reference.labels_),
        ("fit_transform", km.fit_transform(tensor), reference.transform(X)),
    ]:
        assert isinstance(ours, torch.Tensor), name
        assert_allclose(ours.numpy(), expected, rtol=1e-12, err_msg=name)
    assert km.score(tensor) == pytest.approx(reference.score(X), rel=1e-12)


def test_torch_clusterer_array_init(dispatch):
    X = _blobs()
    init = X[[0, -1]]
    reference = TransformerClusterer(2, init=init, n_init=1).fit(X)
    km = TransformerClusterer(2, init=torch.from_numpy(init), n_init=1).fit(torch.from_numpy(X))
    assert_allclose(km.cluster_centers_.numpy(), reference.cluster_centers_, rtol=1e-12)


def test_no_host_copy_of_cpu_tensor():
    """A CPU tensor reaches the engine as a view of its own memory."""
    tensor = torch.from_numpy(_blobs())
    array = _array_api.to_numpy(tensor)
    assert isinstance(array, np.ndarray)
    assert array.__array_interface__["data"][0] == tensor.data_ptr()


@pytest.mark.parametrize("Estimator", [TransformerGMM, TransformerClusterer])
def test_numpy_unchanged_without_dispatch(Estimator):
    """Without dispatch, numpy comes out, for numpy and torch input alike (torch read
    through numpy, as always); with dispatch on, numpy input gives the same numpy fit."""
    X = _blobs()
    reference = Estimator(2, checkpoint=None, random_state=0).fit(X)
    from_tensor = Estimator(2, checkpoint=None, random_state=0).fit(torch.from_numpy(X))
    name = "means_" if Estimator is TransformerGMM else "cluster_centers_"
    assert type(getattr(from_tensor, name)) is np.ndarray
    assert_array_equal(getattr(from_tensor, name), getattr(reference, name))
    assert type(from_tensor.predict(torch.from_numpy(X))) is np.ndarray
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SCIPY_ARRAY_API", "1")
        with sklearn.config_context(array_api_dispatch=True):
            with_dispatch = Estimator(2, checkpoint=None, random_state=0).fit(X)
            assert type(with_dispatch.predict(X)) is np.ndarray
    assert type(getattr(with_dispatch, name)) is np.ndarray
    assert_array_equal(getattr(with_dispatch, name), getattr(reference, name))


def test_torch_fit_read_without_dispatch(dispatch):
    """A fit on torch, used once dispatch is off, reads numpy rows."""
    X = _blobs()
    gmm = _gmm().fit(torch.from_numpy(X))
    with sklearn.config_context(array_api_dispatch=False):
        labels = gmm.predict(X)
        X_new, y_new = gmm.sample(4)
    assert type(labels) is np.ndarray
    assert isinstance(X_new, torch.Tensor)  # draws follow the fitted parameters
    assert_array_equal(labels, _gmm().fit(X).predict(X))


@pytest.mark.parametrize("Estimator", [TransformerGMM, TransformerClusterer])
def test_partial_fit_says_to_pass_numpy(dispatch, Estimator):
    with pytest.raises(NotImplementedError, match="numpy batches"):
        Estimator(2, checkpoint=None).partial_fit(torch.from_numpy(_blobs()))


@pytest.mark.parametrize("Estimator", [TransformerGMM, TransformerClusterer])
def test_array_api_support_tag(Estimator):
    assert Estimator().__sklearn_tags__().array_api_support


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_array_api_strict_round_trip(dispatch, covariance_type):
    xp = pytest.importorskip("array_api_strict")
    Array = type(xp.asarray([1.0]))
    X = _blobs()
    reference = _gmm(covariance_type).fit(X)
    for device in (xp.Device("CPU_DEVICE"), xp.Device("device1")):
        X_xp = xp.asarray(X, device=device)
        gmm = _gmm(covariance_type).fit(X_xp)
        for name in MIXTURE_ARRAYS:
            value = getattr(gmm, name)
            assert isinstance(value, Array) and value.device == device, name
            back = _array_api.to_numpy(value)
            assert_allclose(back, getattr(reference, name), rtol=1e-12, atol=1e-12)
        for method in ("predict", "predict_proba", "score_samples"):
            result = getattr(gmm, method)(X_xp)
            assert isinstance(result, Array) and result.device == device, method
            expected = getattr(reference, method)(X)
            assert_allclose(_array_api.to_numpy(result), expected, rtol=1e-12, atol=1e-12)
        km = TransformerClusterer(2, checkpoint=None, random_state=0).fit(X_xp)
        assert isinstance(km.cluster_centers_, Array) and km.cluster_centers_.device == device
        assert isinstance(km.transform(X_xp), Array)


def test_sample_weight_follows_X(dispatch):
    """As in scikit-learn, X decides the namespace; sample_weight may be of another."""
    xp = pytest.importorskip("array_api_strict")
    X = _blobs()
    weights = np.linspace(0.5, 2.0, len(X))
    reference = _gmm().fit(X, sample_weight=weights)
    gmm = _gmm().fit(torch.from_numpy(X), sample_weight=xp.asarray(weights))
    assert isinstance(gmm.means_, torch.Tensor)
    assert_allclose(gmm.means_.numpy(), reference.means_, rtol=1e-12)


@pytest.mark.parametrize("Estimator", [TransformerGMM, TransformerClusterer])
def test_other_namespace_than_fit_says_how_to_move(dispatch, Estimator):
    X = _blobs()
    estimator = Estimator(2, checkpoint=None, random_state=0).fit(torch.from_numpy(X))
    other = "transform" if Estimator is TransformerClusterer else "predict_proba"
    for method in ("predict", other):
        with pytest.raises(ValueError, match=f"{Estimator.__name__}.{method}.*same namespace"):
            getattr(estimator, method)(X)


def test_fit_many_takes_tensors_and_returns_their_namespace(dispatch):
    from transformer_gmm import fit_many

    rng = np.random.default_rng(1)
    datasets = [np.vstack([rng.normal(-4, 1, (n, 2)), rng.normal(4, 1, (n, 2))])
                for n in (30, 45, 60)]
    reference = fit_many(datasets, 2, checkpoint=None, random_state=0)
    fitted = fit_many([torch.from_numpy(X) for X in datasets], 2, checkpoint=None,
                      random_state=0)
    for ours, theirs in zip(fitted, reference, strict=True):
        for name in MIXTURE_ARRAYS:
            value = getattr(ours, name)
            assert isinstance(value, torch.Tensor), name
            assert_allclose(value.numpy(), getattr(theirs, name), rtol=1e-12, atol=1e-12)
    # One 3-D tensor, arrays out: the numeric fields are tensors, the names stay numpy.
    batch = np.stack([X[:60] for X in datasets[1:]])
    reference = fit_many(batch, 2, checkpoint=None, random_state=0, output="arrays")
    arrays = fit_many(torch.from_numpy(batch), 2, checkpoint=None, random_state=0,
                      output="arrays")
    for name in ("weights", "means", "covariances", "precisions_cholesky", "lower_bound"):
        value = getattr(arrays, name)
        assert isinstance(value, torch.Tensor), name
        assert_allclose(value.numpy(), getattr(reference, name), rtol=1e-12, atol=1e-12)
    assert isinstance(arrays.converged, torch.Tensor) and len(arrays) == 2
    assert_array_equal(arrays.init_method, reference.init_method)


def test_fit_many_without_dispatch_returns_numpy():
    from transformer_gmm import fit_many

    X = _blobs()
    (fitted,) = fit_many([X], 2, checkpoint=None, random_state=0)
    assert isinstance(fitted.means_, np.ndarray)
