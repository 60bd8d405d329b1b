"""Choosing K: n_components="auto" / n_clusters="auto", candidate lists, the criteria."""

from __future__ import annotations

import functools
import pickle
import warnings

import numpy as np
import pytest
import torch
from conftest import TINY_CHECKPOINT, TINY_K_CHECKPOINT, make_blobs
from sklearn.base import clone
from sklearn.metrics import adjusted_rand_score
from sklearn.model_selection import GridSearchCV

from transformer_gmm import FallbackWarning, TransformerClusterer, TransformerGMM
from transformer_gmm.engine import model_cache
from transformer_gmm.engine.k_posterior import k_posteriors
from transformer_gmm.nn import MixtureTransformer, ModelConfig, config_from_preset

THREE_CENTERS = [(-8.0, 0.0), (8.0, 0.0), (0.0, 12.0)]


@pytest.fixture
def three_blobs_100():
    return make_blobs(100, THREE_CENTERS, seed=0)


def k_of(estimator) -> int:
    return estimator.n_components_ if hasattr(estimator, "n_components_") else estimator.n_clusters_


# --- the model -------------------------------------------------------------------------


def test_k_log_posterior_is_a_distribution_over_one_to_k_max():
    model = MixtureTransformer(config_from_preset("tiny", k_posterior_seeds=3))
    x = torch.randn(2, 30, 4)
    mask = torch.ones(2, 30, dtype=torch.bool)
    mask[1, 20:] = False
    log_p = model.k_log_posterior(x, mask)
    assert log_p.shape == (2, model.config.k_max)
    assert torch.allclose(log_p.exp().sum(-1), torch.ones(2))
    # Padded rows change nothing, as in forward.
    assert torch.allclose(log_p[1], model.k_log_posterior(x[1:, :20])[0], atol=1e-5)
    # A set: row order does not matter.
    assert torch.allclose(log_p[0], model.k_log_posterior(x[:1, torch.randperm(30)])[0], atol=1e-5)


def test_a_model_without_the_head_says_so():
    model = MixtureTransformer(config_from_preset("tiny"))
    assert not model.has_k_posterior
    with pytest.raises(ValueError, match="no K-posterior head"):
        model.k_log_posterior(torch.randn(1, 10, 4))


def test_configs_written_before_the_head_load_without_it():
    config = config_from_preset("tiny").to_dict()
    del config["k_posterior_seeds"]
    assert ModelConfig.from_dict(config).k_posterior_seeds == 0


def test_the_engine_reads_a_posterior_whatever_the_row_order(three_blobs_100):
    backbone = model_cache.load_backbone(TINY_K_CHECKPOINT)
    X = three_blobs_100
    p = k_posteriors(backbone, [X], seed=0)
    assert p.shape == (1, 4) and np.isclose(p.sum(), 1.0)
    permuted = k_posteriors(backbone, [X[np.random.default_rng(1).permutation(len(X))]], seed=0)
    np.testing.assert_allclose(p, permuted, atol=1e-6)
    two_views = k_posteriors(backbone, [X], seed=0, n_views=2)
    assert two_views.shape == (1, 4) and not np.allclose(two_views, p)


# --- choosing --------------------------------------------------------------------------


@pytest.mark.parametrize("Estimator", [TransformerGMM, TransformerClusterer])
def test_bic_finds_three_separated_blobs(Estimator, three_blobs_100):
    name = "n_components" if Estimator is TransformerGMM else "n_clusters"
    estimator = Estimator(**{name: "auto"}, checkpoint=None, random_state=0).fit(three_blobs_100)
    assert k_of(estimator) == 3
    assert estimator.selection_criterion_ == "bic"
    np.testing.assert_array_equal(estimator.candidates_, np.arange(1, 11))
    assert estimator.criterion_.shape == (10,) and np.argmin(estimator.criterion_) == 2
    assert not hasattr(estimator, "k_posterior_")  # no checkpoint, no posterior


def test_bic_of_the_mixture_is_the_fitted_estimators(three_blobs_100):
    gmm = TransformerGMM(n_components="auto", checkpoint=None, random_state=0).fit(three_blobs_100)
    assert np.isclose(gmm.criterion_[2], gmm.bic(three_blobs_100))


def test_one_gaussian_is_a_candidate():
    X = np.random.default_rng(0).standard_normal((300, 3))
    gmm = TransformerGMM(n_components="auto", checkpoint=None, random_state=0).fit(X)
    assert gmm.n_components_ == 1 and gmm.weights_.shape == (1,)


def test_without_the_head_bics_choice_is_the_fit_of_that_k(three_blobs_100):
    # No pass reads P(K | X): each candidate is the estimator's fit of its K, to the bit.
    X = three_blobs_100
    auto = TransformerGMM(
        n_components="auto", criterion="bic", checkpoint=TINY_CHECKPOINT, random_state=0
    ).fit(X)
    K = auto.n_components_
    direct = TransformerGMM(n_components=K, checkpoint=TINY_CHECKPOINT, random_state=0).fit(X)
    np.testing.assert_array_equal(auto.means_, direct.means_)
    np.testing.assert_array_equal(auto.predict(X), direct.predict(X))
    assert auto.score(X) == direct.score(X) and auto.bic(X) == direct.bic(X)


@pytest.fixture
def backbone_passes(monkeypatch) -> list[str]:
    """The backbone's passes, in order: "forward" (under K's embedding) or "k_unknown"."""
    passes = []
    for name, label in (("forward", "forward"), ("k_unknown_tokens", "k_unknown")):
        original = getattr(MixtureTransformer, name)

        def counted(self, *args, _original=original, _label=label, **kwargs):
            passes.append(_label)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(MixtureTransformer, name, counted)
    return passes


@pytest.mark.parametrize("Estimator", [TransformerGMM, TransformerClusterer])
def test_the_posteriors_choice_is_fitted_from_the_pass_that_chose_it(
    Estimator, backbone_passes, three_blobs_100
):
    # One pass in all: K's head reads the tokens that P(K | X) was read from.
    X = three_blobs_100
    name = "n_components" if Estimator is TransformerGMM else "n_clusters"
    params = dict(criterion="posterior", checkpoint=TINY_K_CHECKPOINT, random_state=0)
    # One candidate, the blobs' 3: the untrained tiny model chooses no other way.
    auto = Estimator(**{name: [3]}, **params).fit(X)
    assert backbone_passes == ["k_unknown"]
    K = k_of(auto)
    direct = Estimator(**{name: K}, **params).fit(X)
    assert backbone_passes == ["k_unknown", "forward"]
    # Separated blobs: both starts reach the same optimum, its components in some order.
    assert adjusted_rand_score(auto.predict(X), direct.predict(X)) == 1.0
    centers = "means_" if Estimator is TransformerGMM else "cluster_centers_"
    a, b = (np.sort(getattr(e, centers), axis=0) for e in (auto, direct))
    np.testing.assert_allclose(a, b, atol=1e-8)
    if Estimator is TransformerGMM:
        assert auto.predict_proba(X).shape == (len(X), K) and auto.sample(5)[0].shape == (5, 2)


@pytest.mark.parametrize("Estimator", [TransformerGMM, TransformerClusterer])
def test_bics_candidates_share_the_pass_that_read_the_posterior(
    Estimator, backbone_passes, three_blobs_100
):
    X = three_blobs_100
    name = "n_components" if Estimator is TransformerGMM else "n_clusters"
    params = dict(checkpoint=TINY_K_CHECKPOINT, random_state=0)
    auto = Estimator(**{name: "auto"}, criterion="bic", **params).fit(X)
    assert auto.selection_criterion_ == "bic" and len(auto.candidates_) == 4
    assert backbone_passes == ["k_unknown"]  # one pass for P(K | X) and every candidate
    K = k_of(auto)
    # The chosen candidate is the fit that the posterior would have made of that K.
    alone = Estimator(**{name: [K]}, criterion="posterior", **params).fit(X)
    centers = "means_" if Estimator is TransformerGMM else "cluster_centers_"
    np.testing.assert_array_equal(getattr(auto, centers), getattr(alone, centers))
    np.testing.assert_array_equal(auto.predict(X), alone.predict(X))
    assert auto.score(X) == alone.score(X)
    if Estimator is TransformerGMM:
        assert auto.bic(X) == alone.bic(X)
        assert np.isclose(auto.criterion_[auto.candidates_ == K][0], auto.bic(X))
        assert auto.predict_proba(X).shape == (len(X), K) and auto.sample(5)[0].shape == (5, 2)


@pytest.mark.parametrize("Estimator", [TransformerGMM, TransformerClusterer])
def test_bics_candidates_on_a_dataframe_keep_its_feature_names(Estimator, three_blobs_100):
    pd = pytest.importorskip("pandas")
    X = pd.DataFrame(three_blobs_100, columns=["a", "b"])
    name = "n_components" if Estimator is TransformerGMM else "n_clusters"
    estimator = Estimator(
        **{name: "auto"}, criterion="bic", checkpoint=TINY_K_CHECKPOINT, random_state=0
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "X does not have valid feature names"
        estimator.fit(X)
        labels = estimator.predict(X)
    assert list(estimator.feature_names_in_) == ["a", "b"] and estimator.n_features_in_ == 2
    assert len(labels) == len(X)


@pytest.mark.parametrize(
    "params",
    [
        dict(n_views=2),  # two views read, four starts
        dict(n_views=2, n_init=1),  # the first view's alone
        dict(n_views=2, n_init=3),
        dict(max_iter=0),  # the transformer's own estimate, from the pass that chose K
        dict(n_init=5),  # three k-means++ starts beside the transformer's two
    ],
)
@pytest.mark.parametrize("criterion", ["posterior", "bic"])
@pytest.mark.parametrize("Estimator", [TransformerGMM, TransformerClusterer])
def test_every_start_reads_the_pass_that_chose_k(Estimator, criterion, params, three_blobs_100):
    if Estimator is TransformerClusterer and "max_iter" in params:
        params = dict(max_iter=1)  # k-means takes no max_iter=0
    X = three_blobs_100
    name = "n_components" if Estimator is TransformerGMM else "n_clusters"
    common = dict(criterion=criterion, checkpoint=TINY_K_CHECKPOINT, **params)
    weights = np.random.default_rng(1).uniform(0.5, 2.0, len(X))
    for sample_weight in (None, weights):
        a = Estimator(**{name: [2, 3, 4]}, random_state=0, **common)
        a.fit(X, sample_weight=sample_weight)
        order = np.random.default_rng(2).permutation(len(X))
        b = Estimator(**{name: [2, 3, 4]}, random_state=0, **common)
        w = None if sample_weight is None else sample_weight[order]
        b.fit(X[order], sample_weight=w)
        # The same random_state, the same fit, whatever the row order.
        assert k_of(a) == k_of(b)
        np.testing.assert_array_equal(a.predict(X), b.predict(X))
        assert a.init_method_ in ("transformer", "k-means++")


def test_the_posterior_over_candidates(three_blobs_100):
    X = three_blobs_100
    posterior = dict(criterion="posterior", checkpoint=TINY_K_CHECKPOINT, random_state=0)
    gmm = TransformerGMM(n_components="auto", **posterior).fit(X)
    # The tiny checkpoint reads K = 1..4: those are the default candidates.
    np.testing.assert_array_equal(gmm.candidates_, [1, 2, 3, 4])
    assert gmm.selection_criterion_ == "posterior" and np.isclose(gmm.k_posterior_.sum(), 1.0)
    assert gmm.n_components_ == gmm.candidates_[np.argmax(gmm.k_posterior_)]
    np.testing.assert_allclose(gmm.criterion_, -np.log(gmm.k_posterior_))
    some = TransformerGMM(n_components=[2, 4], **posterior).fit(X)
    expected = gmm.k_posterior_[[1, 3]] / gmm.k_posterior_[[1, 3]].sum()
    np.testing.assert_allclose(some.k_posterior_, expected)
    # The default, "auto", takes the posterior where the model reads one for every
    # candidate; BIC also reports it.
    default = TransformerGMM(n_components="auto", checkpoint=TINY_K_CHECKPOINT, random_state=0)
    assert default.fit(X).selection_criterion_ == "posterior"
    assert default.n_components_ == gmm.n_components_
    np.testing.assert_array_equal(default.means_, gmm.means_)
    bic = TransformerGMM(
        n_components="auto", criterion="bic", checkpoint=TINY_K_CHECKPOINT, random_state=0
    )
    assert bic.fit(X).selection_criterion_ == "bic"
    np.testing.assert_allclose(bic.k_posterior_, gmm.k_posterior_)


def test_bic_serves_checkpoints_without_the_head(three_blobs_100):
    # "auto" (the default) falls back to BIC wherever the posterior cannot serve.
    X = three_blobs_100
    no_head = TransformerGMM(n_components="auto", checkpoint=TINY_CHECKPOINT, random_state=0)
    assert no_head.fit(X).selection_criterion_ == "bic"
    np.testing.assert_array_equal(no_head.candidates_, [1, 2, 3, 4])  # what it covers
    assert not hasattr(no_head, "k_posterior_")
    beyond = TransformerGMM(n_components=[2, 3, 6], checkpoint=TINY_K_CHECKPOINT, random_state=0)
    with pytest.warns(FallbackWarning, match="not 6"):
        assert beyond.fit(X).selection_criterion_ == "bic"
    assert not hasattr(beyond, "k_posterior_")  # the head reads K up to 4 only


@pytest.mark.parametrize("Estimator", [TransformerGMM, TransformerClusterer])
def test_the_choice_does_not_depend_on_the_row_order(Estimator, three_blobs_100):
    X = three_blobs_100
    name = "n_components" if Estimator is TransformerGMM else "n_clusters"
    params = {name: "auto", "criterion": "posterior", "checkpoint": TINY_K_CHECKPOINT}
    params["random_state"] = 0
    a = Estimator(**params).fit(X)
    b = Estimator(**params).fit(X[np.random.default_rng(3).permutation(len(X))])
    assert k_of(a) == k_of(b)
    np.testing.assert_allclose(a.k_posterior_, b.k_posterior_, atol=1e-6)


def test_an_int_fit_after_an_auto_fit_forgets_the_choice(three_blobs_100):
    gmm = TransformerGMM(n_components="auto", checkpoint=None, random_state=0).fit(three_blobs_100)
    gmm.set_params(n_components=2).fit(three_blobs_100)
    assert gmm.n_components_ == 2 and not hasattr(gmm, "candidates_")


def test_warm_start_keeps_the_chosen_k(three_blobs_100):
    gmm = TransformerGMM(n_components="auto", checkpoint=None, warm_start=True, random_state=0)
    gmm.fit(three_blobs_100)
    gmm.fit(three_blobs_100)
    assert gmm.n_components_ == 3 and gmm.init_method_ == "warm_start"


def test_auto_estimators_clone_pickle_and_search(three_blobs_100):
    X = three_blobs_100
    gmm = TransformerGMM(n_components="auto", checkpoint=TINY_K_CHECKPOINT, random_state=0)
    assert clone(gmm).get_params()["n_components"] == "auto"
    fitted = gmm.fit(X)
    again = pickle.loads(pickle.dumps(fitted))
    np.testing.assert_array_equal(again.predict(X), fitted.predict(X))
    search = GridSearchCV(
        TransformerGMM(checkpoint=None, random_state=0),
        {"n_components": [2, "auto"], "criterion": ["bic"]},
        cv=3,
    ).fit(X)
    assert search.best_params_["n_components"] in (2, "auto")


def test_sample_weight_reaches_the_choice(three_blobs_100):
    X = three_blobs_100
    weights = np.ones(len(X))
    weights[X[:, 1] > 6] = 0.0  # drop the top blob: two remain
    gmm = TransformerGMM(n_components="auto", checkpoint=None, random_state=0)
    assert gmm.fit(X, sample_weight=weights).n_components_ == 2


# --- bad input -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "params, match",
    [
        (dict(n_components="auto", max_components=40), "max_components=40 exceeds n_samples=30"),
        (dict(n_components=[2, 31]), "go up to 31, but there are only n_samples=30"),
        (dict(n_components=[0, 2]), "must be positive ints"),
        (dict(n_components=[2.5, 3]), "must be positive ints"),
        (dict(n_components=[]), "non-empty list"),
        (dict(n_components=[[2, 3]]), "non-empty list"),
        (dict(n_components="auto", criterion="posterior"), "criterion='posterior' needs"),
        (dict(n_components="auto", weights_init=[0.5, 0.5]), "fix the number of components"),
    ],
)
def test_bad_choices_are_clear_errors(params, match):
    X = np.random.default_rng(0).standard_normal((30, 2))
    with pytest.raises(ValueError, match=match):
        TransformerGMM(checkpoint=None, **params).fit(X)


def test_the_clusterer_says_the_same():
    X = np.random.default_rng(0).standard_normal((30, 2))
    with pytest.raises(ValueError, match="max_clusters=31 exceeds n_samples=30"):
        TransformerClusterer(n_clusters="auto", max_clusters=31, checkpoint=None).fit(X)
    with pytest.raises(ValueError, match="An array init fixes the number of clusters"):
        TransformerClusterer(n_clusters="auto", init=X[:3], checkpoint=None).fit(X)
    with pytest.raises(ValueError, match="reads P\\(K \\| X\\) up to K=4"):
        TransformerClusterer(
            n_clusters=[2, 6], criterion="posterior", checkpoint=TINY_K_CHECKPOINT
        ).fit(X)


@pytest.mark.parametrize(
    "covariance_type, top", [("tied", 6), ("spherical", 3), ("diag", 3), ("full", 2)]
)
def test_the_default_candidates_stop_where_components_can_hold_their_points(
    covariance_type, top
):
    # 6 rows in 2-D: each component needs 3 rows for a full covariance, 2 for a variance,
    # none for a tied one (at most n_samples components, and the clusterer's K, still).
    X = np.random.default_rng(0).standard_normal((6, 2))
    gmm = TransformerGMM(
        n_components="auto", covariance_type=covariance_type, checkpoint=None, random_state=0
    ).fit(X)
    np.testing.assert_array_equal(gmm.candidates_, np.arange(1, top + 1))
    km = TransformerClusterer(n_clusters="auto", checkpoint=None, random_state=0).fit(X)
    np.testing.assert_array_equal(km.candidates_, np.arange(1, 7))
    explicit = TransformerGMM(n_components="auto", max_components=4, checkpoint=None,
                              covariance_type=covariance_type, random_state=0).fit(X)
    np.testing.assert_array_equal(explicit.candidates_, np.arange(1, 5))  # as asked


def test_fit_many_takes_one_int():
    from transformer_gmm import fit_many

    with pytest.raises(ValueError, match="fit_many fits one n_components, an int"):
        fit_many([np.zeros((10, 2))], "auto", checkpoint=None)


def test_a_dask_array_needs_an_int(dask_client):
    da = pytest.importorskip("dask.array")
    X = da.from_array(make_blobs(50, THREE_CENTERS), chunks=(50, 2))
    with pytest.raises(ValueError, match="n_components other than an int"):
        TransformerGMM(n_components="auto", checkpoint=None).fit(X)
    with pytest.raises(ValueError, match="n_clusters other than an int"):
        TransformerClusterer(n_clusters="auto", checkpoint=None).fit(X)


# --- training the head -----------------------------------------------------------------


def test_training_the_head_changes_nothing_else_and_resumes(tmp_path):
    from transformer_gmm.storage import load_checkpoint
    from transformer_gmm.training import k_posterior

    out = tmp_path / "run"
    args = ["--source", TINY_CHECKPOINT, "--out", str(out), "--batch-size", "4"]
    k_posterior.main([*args, "--steps", "2", "--save-every", "1"])
    k_posterior.main([*args, "--steps", "3", "--save-every", "1", "--resume"])
    assert torch.load(out / "state.pt", weights_only=False)["step"] == 3
    source, trained = load_checkpoint(TINY_CHECKPOINT), load_checkpoint(out / "checkpoint")
    assert trained.has_k_posterior and trained.config.k_posterior_seeds == 4
    state = trained.state_dict()
    for name, weight in source.state_dict().items():  # every fit of a given K is unchanged
        assert torch.equal(state[name], weight), name
    x, mask, k = k_posterior.sample_k_batch(
        np.random.default_rng(0), trained.config, trained.reading_config, 6
    )
    assert x.shape[0] == 6 and x.shape[1] <= trained.reading_config.context_size
    assert k.min() >= 0 and k.max() < trained.config.k_max  # K - 1, K in 1..k_max


def test_a_frozen_k_unknown_embedding_stays_and_the_head_learns(tmp_path):
    from transformer_gmm.storage import load_checkpoint
    from transformer_gmm.training import k_posterior

    out = tmp_path / "run"
    args = ["--source", TINY_CHECKPOINT, "--out", str(out), "--batch-size", "4"]
    k_posterior.main([*args, "--steps", "2", "--freeze-k-unknown", "--lr", "1e-2"])
    start = k_posterior.with_k_posterior_head(load_checkpoint(TINY_CHECKPOINT), 4)
    trained = load_checkpoint(out / "checkpoint")
    assert torch.equal(trained.k_unknown, start.k_unknown)  # the mean of the K embeddings
    head = "k_posterior_head.out.weight"
    assert not torch.equal(trained.state_dict()[head], start.state_dict()[head])
    x, mask, _ = k_posterior.sample_k_batch(
        np.random.default_rng(0), trained.config, trained.reading_config, 3
    )
    k_posterior.trainable(trained, k_unknown=False)
    frozen = k_posterior.k_log_posterior(trained, x, mask, k_unknown=False)
    torch.testing.assert_close(frozen, trained.k_log_posterior(x, mask))
    frozen.sum().backward()
    assert trained.k_unknown.grad is None and trained.readin.weight.grad is None
    assert trained.k_posterior_head.out.weight.grad is not None


def test_head_batches_drawn_by_workers_are_the_steps_own():
    from transformer_gmm.storage import load_checkpoint
    from transformer_gmm.training import k_posterior
    from transformer_gmm.training.prefetch import step_batches

    model = load_checkpoint(TINY_CHECKPOINT)
    config, reading = model.config, model.reading_config
    draw = functools.partial(
        k_posterior.k_batch_of_step, config=config, reading=reading, batch_size=3, seed=7
    )
    in_process = step_batches(draw, 5, 8)
    by_workers = step_batches(draw, 5, 8, workers=2)
    for _ in range(3):  # steps 5, 6, 7, whichever worker drew them
        for a, b in zip(next(in_process), next(by_workers), strict=True):
            assert torch.equal(a, b)
    step_6 = k_posterior.sample_k_batch(np.random.default_rng([7, 6]), config, reading, 3)
    again = step_batches(draw, 6, 7)
    assert all(torch.equal(a, b) for a, b in zip(step_6, next(again), strict=True))


def test_a_head_goes_on_from_the_sources_unless_asked_or_shaped_otherwise():
    from conftest import TINY_K_CHECKPOINT

    from transformer_gmm.storage import load_checkpoint
    from transformer_gmm.training.k_posterior import with_k_posterior_head

    source = load_checkpoint(TINY_K_CHECKPOINT)
    seeds = source.config.k_posterior_seeds
    head = "k_posterior_head.out.weight"

    def same_head(model):
        return torch.equal(model.state_dict()[head], source.state_dict()[head])

    assert same_head(with_k_posterior_head(source, seeds))
    torch.manual_seed(0)
    assert not same_head(with_k_posterior_head(source, seeds, new_head=True))
    wider = with_k_posterior_head(source, seeds + 2)  # another shape: a new head
    assert wider.config.k_posterior_seeds == seeds + 2
    for model in (with_k_posterior_head(source, seeds), wider):
        # "K unknown" starts as the mean of the K embeddings, and the rest is the source's.
        torch.testing.assert_close(model.k_unknown, source.k_embedding.weight.mean(dim=0))
        torch.testing.assert_close(model.blocks[0].mlp.fc.weight, source.blocks[0].mlp.fc.weight)


# --- counting clusters of any shape ----------------------------------------------------


def test_the_cluster_count_head_needs_the_k_unknown_embedding():
    with pytest.raises(ValueError, match="cluster_count_seeds > 0 needs k_posterior_seeds"):
        config_from_preset("tiny", cluster_count_seeds=2)
    config = config_from_preset("tiny", k_posterior_seeds=2, cluster_count_seeds=2).to_dict()
    assert ModelConfig.from_dict(config).cluster_count_seeds == 2
    del config["cluster_count_seeds"]  # written before the head: none
    assert ModelConfig.from_dict(config).cluster_count_seeds == 0
    with pytest.raises(ValueError, match="no cluster-count head"):
        MixtureTransformer(config_from_preset("tiny")).cluster_count_log_posterior(
            torch.randn(1, 10, 4)
        )


def _with_cluster_count(folder, favoured: int):
    """The tiny checkpoint with a cluster-count head whose answer is ``favoured`` clusters,
    whatever the data; saved to ``folder``."""
    from transformer_gmm.storage import load_checkpoint, save_checkpoint
    from transformer_gmm.training.k_posterior import with_cluster_count_head

    model = with_cluster_count_head(load_checkpoint(TINY_K_CHECKPOINT))
    with torch.no_grad():
        model.cluster_count_head.out.weight.zero_()
        model.cluster_count_head.out.bias.zero_()
        model.cluster_count_head.out.bias[favoured - 1] = 10.0
    save_checkpoint(model, folder)
    return str(folder)


@pytest.mark.parametrize("favoured", [1, 4])
def test_the_clusterer_reads_both_counts(tmp_path, three_blobs_100, favoured):
    from transformer_gmm.engine.k_posterior import read_k_unknown

    X = three_blobs_100
    folder = _with_cluster_count(tmp_path / "clusters", favoured)
    gmm = TransformerGMM(n_components="auto", checkpoint=folder, random_state=0).fit(X)
    before = TransformerGMM(n_components="auto", checkpoint=TINY_K_CHECKPOINT, random_state=0)
    # The mixture reads P(K | X) as before, to the bit.
    np.testing.assert_array_equal(gmm.k_posterior_, before.fit(X).k_posterior_)
    clusterer = TransformerClusterer(n_clusters="auto", checkpoint=folder, random_state=0).fit(X)
    assert clusterer.selection_criterion_ == "posterior"
    # P(C | X) P(K | X)^(1/2), normalized, from the one pass the clusterer reads.
    seed = np.random.RandomState(0).randint(np.iinfo(np.int32).max)
    p_k, _, p_c = read_k_unknown(model_cache.load_backbone(folder), [X], seed=seed, clusters=True)
    both = p_c[0] * np.sqrt(p_k[0].astype(np.float64))
    np.testing.assert_allclose(clusterer.k_posterior_, both / both.sum(), rtol=1e-5)
    # One undercounts and four overcounts the three blobs, which stand apart, each one
    # Gaussian: the rows' count is taken in both cases.
    expected = {1: 3, 4: 3}[favoured]
    assert clusterer.n_clusters_ == expected
    assert clusterer.cluster_centers_.shape[0] == expected


def test_training_the_cluster_count_head_changes_nothing_else(tmp_path):
    from transformer_gmm.storage import load_checkpoint
    from transformer_gmm.training import k_posterior

    out = tmp_path / "run"
    k_posterior.main([
        "--source", TINY_K_CHECKPOINT, "--out", str(out), "--batch-size", "4", "--steps", "2",
        "--head", "clusters", "--lr", "1e-2", "--prior-weights", "shapes=0.5,unit=0.5",
    ])
    source, trained = load_checkpoint(TINY_K_CHECKPOINT), load_checkpoint(out / "checkpoint")
    assert trained.has_cluster_count
    state = trained.state_dict()
    for name, weight in source.state_dict().items():  # the K posterior and every fit stay
        assert torch.equal(state[name], weight), name
    # It starts as the K-posterior head, and learned.
    assert not torch.equal(
        state["cluster_count_head.out.weight"], state["k_posterior_head.out.weight"]
    )


def test_shape_tasks_hold_the_rows_asked_for():
    from transformer_gmm.training.shapes import sample_shapes

    for k in (1, 2, 4, 10):
        for d in (2, 3, 6):
            X = sample_shapes(np.random.default_rng([k, d]), k, d, 16 * k + 50)
            assert X.shape == (16 * k + 50, d) and np.isfinite(X).all()
            again = sample_shapes(np.random.default_rng([k, d]), k, d, 16 * k + 50)
            np.testing.assert_array_equal(X, again)
            sheared = sample_shapes(np.random.default_rng([k, d]), k, d, 16 * k + 50, 1.0)
            assert sheared.shape == X.shape and np.isfinite(sheared).all()


def test_sheared_shape_tasks_are_one_linear_map_of_the_plane():
    # Every cluster stretched alike, and the gaps with them: one map of the whole plane,
    # whose smaller stretch against its larger lies in SHEAR_RATIO.
    from transformer_gmm.training.shapes import SHEAR_RATIO, _sheared

    X = np.random.default_rng(0).normal(size=(200, 2))
    for seed in range(20):
        Y = _sheared(np.random.default_rng(seed), X)
        A = np.linalg.lstsq(X, Y, rcond=None)[0]
        np.testing.assert_allclose(X @ A, Y, atol=1e-12)
        low, high = np.linalg.svd(A, compute_uv=False)[::-1]
        assert SHEAR_RATIO[0] - 1e-12 <= low / high <= SHEAR_RATIO[1] + 1e-12
