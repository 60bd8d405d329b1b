"""What TransformerGMM and TransformerClusterer share as estimators: parameters, the fit's
skeleton (each estimator supplies its hooks), the doors where data come in, streams'
bookkeeping, the choice of K's state, and the checkpoint's loading and publishing. The
steps of a fit, which :func:`~transformer_gmm.fit_many` shares too, are in
:mod:`transformer_gmm._fitting`."""

from __future__ import annotations

import functools
import os
from numbers import Integral, Real

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import check_is_fitted, validate_data

from . import _array_api, _choose_k, _dask, _fitting, _initialization, _missing, storage
from ._rows import Rows
from .engine import model_cache
from .storage.checkpoints import is_missing_default


@functools.cache
def _init_parameter_names(cls: type, init) -> tuple[str, ...]:
    """scikit-learn's parameter names of ``cls``, whose constructor is ``init``."""
    return tuple(BaseEstimator._get_param_names.__func__(cls))


class TransformerMixtureBase(BaseEstimator):
    """Skeleton shared by the estimators; subclasses name their component count."""

    @classmethod
    def _get_param_names(cls) -> list[str]:
        """scikit-learn's, read from the constructor's signature once per class: reading it
        costs a tenth of a millisecond, and a fit asks four times (scikit-learn's parameter
        validation, the array-API check, the fit's parameters), as clone and grid search do."""
        return list(_init_parameter_names(cls, cls.__init__))

    _parameter_constraints: dict = {
        "checkpoint": [str, os.PathLike, None],
        "max_iter": [Interval(Integral, 0, None, closed="left")],
        "tol": [Interval(Real, 0.0, None, closed="left")],
        "n_init": [StrOptions({"auto"}), Interval(Integral, 1, None, closed="left")],
        "n_views": [StrOptions({"auto"}), Interval(Integral, 1, None, closed="left")],
        "device": [str],  # "auto", "cpu", "cuda" or "cuda:N", checked when fit resolves it
        "random_state": ["random_state"],
    }

    # --- input: the doors -----------------------------------------------------------
    # Data come in through three doors: _fit, _read_rows (every method that scores rows)
    # and _check_batch (partial_fit). Each decides once whether X is a Dask array, whose
    # every pass is one Dask computation over its chunks; nothing past them asks again.

    # Sparse input the estimator takes: False, or "csr" (scipy's other formats convert).
    _accept_sparse: bool | str = False
    # Whether fit and the methods that score rows take NaN as a missing entry.
    _allow_nan: bool = False

    def _read_rows(self, X, method: str, attribute: str) -> Rows:
        """``X`` validated for ``method`` of the fitted estimator: the door through which
        every method that scores rows takes them. With ``array_api_dispatch`` on, ``X``
        must be of the namespace and device of the fitted ``attribute``."""
        check_is_fitted(self)
        if _dask.is_dask_array(X):
            return Rows(_dask.validate(self, X, reset=False), None, chunked=True)
        _array_api.check_fitted_namespace(X, self, attribute=attribute, method=method)
        namespace = _array_api.input_namespace(X)
        if namespace is not None:
            X = _array_api.to_numpy(X)
        X = validate_data(
            self,
            X,
            accept_sparse=self._accept_sparse,
            dtype=[np.float64, np.float32],
            reset=False,
            ensure_all_finite="allow-nan" if self._allow_nan else True,
        )
        return Rows(X, namespace, chunked=False)

    @staticmethod
    def _check_batch(X) -> None:
        """``partial_fit``'s door: a batch is in memory."""
        if _dask.is_dask_array(X):
            raise ValueError(
                "partial_fit takes a batch in memory; pass batch.compute(), or fit the whole "
                "dask array with fit."
            )

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = self._allow_nan
        tags.input_tags.sparse = bool(self._accept_sparse)
        # With sklearn's array_api_dispatch on, arrays of any namespace come in, and the
        # fitted parameters and results go back in it (see transformer_gmm._array_api).
        tags.array_api_support = True
        return tags

    # --- the fit ----------------------------------------------------------------------

    # The parameter that sets the number of components ("n_components", "n_clusters").
    _k_name: str = ""
    # The error of a fit on a Dask array that needs X in memory (_needs_X_in_memory).
    _in_memory_message: str = ""

    def _fit(self, X, sample_weight) -> Rows:
        """Every fit, in scikit-learn's manner (``BaseMixture.fit_predict``): read the
        input, validate it, choose K where asked, fit K (on the observed entries where X
        holds NaN, which the starts and the choice of K read mean-imputed), set the fitted
        state; returns the validated rows, numpy or a Dask array.

        Arrays of another namespace than numpy (``array_api_dispatch`` on) are read as
        numpy here, once, and the fitted state goes back to their namespace and device at
        the end. Each estimator supplies the hooks: ``_needs_X_in_memory``,
        ``_forget_previous_fit``, ``_choose`` (K and the pass that chose it, or None where
        the choice fitted it), ``_fit_k``, ``_fit_k_missing``, ``_fitted_k`` and
        ``_after_fit``."""
        K = getattr(self, self._k_name)
        auto = _choose_k.is_auto(K)
        if _dask.is_dask_array(X):
            return self._fit_chunks(X, sample_weight, K, auto)
        namespace = _array_api.input_namespace(X)
        if namespace is not None:
            X = _array_api.to_numpy(X)
        sample_weight = _array_api.to_numpy(sample_weight)  # of any namespace: it follows X
        # A warm start goes on from parameters a fit may have returned in another namespace.
        _array_api.attributes_to_numpy(self)
        X = _fitting.validate_fit_data(
            self, X, 1 if auto else K, self._accept_sparse, self._too_few_samples,
            allow_nan=True,
        )
        has_missing = _missing.has_missing(X)
        start_rows = X  # what the starts and the choice of K read: with NaN, the imputed rows
        if has_missing:
            _missing.check_fit_data(self, X)
            start_rows = _missing.mean_imputed(X)
        sample_weight = _initialization.check_sample_weight(sample_weight, X, 1)
        self._forget_previous_fit()
        k_unknown_pass = None
        if not auto:
            self._store_choice(None)
        else:
            K, k_unknown_pass = self._choose(start_rows, sample_weight, has_missing)
        if K is None and has_missing:  # fitted on the imputed rows by the choice: refitted
            K = self._fitted_k()
        if has_missing:
            self._fit_k_missing(X, start_rows, sample_weight, K, k_unknown_pass)
        elif K is not None:  # else the choice fitted the chosen K: its fit is kept
            self._fit_k(X, sample_weight, K, k_unknown_pass)
        self._after_fit(X)
        _array_api.attributes_to_input(self, namespace)
        return Rows(X, namespace, chunked=False)

    def _fit_chunks(self, X, sample_weight, K, auto: bool) -> Rows:
        """:meth:`_fit` of a Dask array: every EM or Lloyd pass is one Dask computation
        over its chunks (:func:`transformer_gmm._dask.fit_plan`), and what needs ``X`` in
        memory is refused."""
        X = _dask.validate(self, X, reset=True, min_samples=2)
        if not auto and X.shape[0] < K:
            raise ValueError(self._too_few_samples(K, X.shape[0]))
        if self._needs_X_in_memory(auto, sample_weight):
            raise ValueError(self._in_memory_message)
        self._forget_previous_fit()
        self._store_choice(None)
        self._fit_k(X, None, K, run=_dask.fit_plan)
        self._after_fit(X)
        return Rows(X, None, chunked=True)

    @staticmethod
    def _too_few_samples(n_components: int, n_samples: int) -> str:
        return _fitting.too_few_samples_message(n_components, n_samples)

    def _forget_previous_fit(self) -> None:
        """Drop what an earlier fit set and this one may not."""

    def _after_fit(self, X) -> None:
        """Warnings about the fitted state."""

    def _fit_params(self) -> dict:
        """The parameters as this fit reads them
        (:func:`~transformer_gmm._fitting.resolved_params`): those of the first batch of a
        stream while :meth:`_fit_first_batch` runs."""
        first_batch = getattr(self, "_reading_first_batch", False)
        views = self._stream_views if first_batch else 1
        return _fitting.resolved_params(self.get_params(deep=False), views)

    # --- streams (partial_fit) --------------------------------------------------------

    # The views ``n_views="auto"`` reads of a stream's first batch: fit's one, unless an
    # estimator's streams gain from more (the stream shares that fit's cost).
    _stream_views: int = 1

    def _fit_first_batch(self, X, sample_weight) -> Rows:
        """A stream's first call: :meth:`_fit` on the batch, whose ``n_views="auto"``
        reads ``_stream_views`` views."""
        self._reading_first_batch = True
        try:
            return self._fit(X, sample_weight)
        finally:
            del self._reading_first_batch

    # The fitted attribute a stream's steps replace: the stream's last step keeps it again
    # as _partial_fit_mark, so a fit since then (which replaces the attribute) is seen,
    # and the next partial_fit starts a new stream.
    _streamed_attribute: str = ""

    def _is_streaming(self) -> bool:
        """Whether the streamed attribute is the one the last ``partial_fit`` set (an
        unfitted estimator, or one a ``fit`` has fitted since, starts a stream)."""
        mark = getattr(self, "_partial_fit_mark", None)
        return mark is not None and mark is getattr(self, self._streamed_attribute, None)

    def _start_stream(self, n_samples: int) -> None:
        """Count the first batch, which ``fit`` has just fitted."""
        self.n_steps_, self.n_samples_seen_ = 1, n_samples
        self._mark_stream()

    def _count_batch(self, n_samples: int) -> None:
        self.n_steps_ += 1
        self.n_samples_seen_ += n_samples

    def _mark_stream(self) -> None:
        self._partial_fit_mark = getattr(self, self._streamed_attribute)

    # --- the choice of K ------------------------------------------------------------------

    def _fit_as_candidate(self, X, sample_weight, K: int, k_unknown_pass) -> None:
        """Fit ``K`` components to ``X``, a candidate of the choice of K whose
        transformer's starts read ``k_unknown_pass``, the pass that read P(K | X)."""
        # X is the choosing estimator's, validated into an array: this one records its
        # width, as its own fit on that array would (and no feature names, which the array
        # has lost).
        self.n_features_in_ = X.shape[1]
        self._fit_k(X, sample_weight, K, k_unknown_pass)

    def _take_fitted(self, fitted) -> None:
        """Become ``fitted``, a fitted estimator of this class (the candidate whose K was
        chosen): its fitted attributes, by reference."""
        for name, value in vars(fitted).items():
            if (name.endswith("_") and not name.startswith("__")) or name == "_n_init":
                setattr(self, name, value)

    def _store_choice(self, choice) -> None:
        """The per-candidate attributes of a fit whose K was chosen (a
        :class:`~transformer_gmm._choose_k.Choice`); None forgets an earlier fit's."""
        for name in ("candidates_", "criterion_", "selection_criterion_", "k_posterior_"):
            self.__dict__.pop(name, None)
        if choice is None:
            return
        self.candidates_ = choice.candidates
        self.criterion_ = choice.values
        self.selection_criterion_ = choice.criterion
        if choice.posterior is not None:
            self.k_posterior_ = choice.posterior

    # --- pretrained checkpoints ----------------------------------------------------------

    @classmethod
    def from_pretrained(cls, checkpoint: str | os.PathLike, **params):
        """An unfitted estimator that uses ``checkpoint``, downloaded and loaded now.

        Equivalent to ``cls(checkpoint=checkpoint, **params)``, except that the checkpoint
        (a bundled name, a local folder, or a Hub id ``"org/name[@revision]"``) is fetched
        and loaded at once, so a wrong name fails here rather than in ``fit``, and ``fit``
        finds the model already in this process's cache.

        Parameters
        ----------
        checkpoint : str or path
            The checkpoint, as the ``checkpoint`` parameter accepts it.
        **params
            Other constructor parameters, e.g. ``n_components=3``.

        Returns
        -------
        estimator
            An unfitted estimator with ``checkpoint`` set.

        Examples
        --------
        >>> import tempfile
        >>> from transformer_gmm import TransformerGMM
        >>> from transformer_gmm.nn import MixtureTransformer, config_from_preset
        >>> from transformer_gmm.storage import save_checkpoint
        >>> model = MixtureTransformer(config_from_preset("tiny"))
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     folder = save_checkpoint(model, tmp + "/m")
        ...     gmm = TransformerGMM.from_pretrained(folder, n_components=2, random_state=0)
        ...     print(gmm.n_components, gmm.checkpoint == folder)
        2 True
        """
        estimator = cls(checkpoint=checkpoint, **params)
        if checkpoint is not None and not is_missing_default(checkpoint):
            model_cache.load_backbone(checkpoint)  # raises CheckpointError for a bad checkpoint
        return estimator

    def save_pretrained(self, folder: str | os.PathLike, *, model_card: str | None = None):
        """Save this estimator's checkpoint to ``folder``, ready to load or upload.

        The folder holds ``config.json``, ``model.safetensors`` and the model card, and
        loads back through ``checkpoint=folder``. Only the transformer is saved, not the
        fitted mixture (pickle or joblib the estimator for that).

        Parameters
        ----------
        folder : str or path
            Where to write the checkpoint (created if needed).
        model_card : str, optional
            The ``README.md`` text; by default the source checkpoint's card.

        Returns
        -------
        folder : pathlib.Path

        Examples
        --------
        >>> import tempfile
        >>> from transformer_gmm import TransformerClusterer
        >>> from transformer_gmm.nn import MixtureTransformer, config_from_preset
        >>> from transformer_gmm.storage import save_checkpoint
        >>> model = MixtureTransformer(config_from_preset("tiny"))
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     source = save_checkpoint(model, tmp + "/a")
        ...     km = TransformerClusterer(n_clusters=3, checkpoint=source)
        ...     copy = km.save_pretrained(tmp + "/b")
        ...     print(sorted(path.name for path in copy.iterdir()))
        ['README.md', 'config.json', 'model.safetensors']
        """
        return storage.export_checkpoint(
            self._checkpoint_to_publish(), folder, model_card=model_card
        )

    def push_to_hub(
        self,
        repo_id: str,
        *,
        token: str | None = None,
        private: bool | None = None,
        commit_message: str | None = None,
        model_card: str | None = None,
    ):
        """Upload this estimator's checkpoint to the Hugging Face Hub as ``repo_id``.

        Creates the repository if needed; needs a token with write access (``token=``,
        ``HF_TOKEN``, or ``hf auth login``). Others then use it with
        ``checkpoint="<repo_id>"``. Returns ``huggingface_hub``'s commit info.

        Parameters
        ----------
        repo_id : str
            The Hub repository, ``"org/name"``.
        token : str, optional
            A token with write access; by default the one ``huggingface_hub`` finds.
        private : bool, optional
            Whether to create the repository as private.
        commit_message : str, optional
            The commit message.
        model_card : str, optional
            The ``README.md`` text; by default the source checkpoint's card.

        Returns
        -------
        commit_info : huggingface_hub.CommitInfo

        Examples
        --------
        An estimator without a transformer has nothing to upload, which is checked first (no
        network is used):

        >>> from transformer_gmm import CheckpointError, TransformerGMM
        >>> try:
        ...     TransformerGMM(checkpoint=None).push_to_hub("me/my-gmm")
        ... except CheckpointError as error:
        ...     print(type(error).__name__)
        CheckpointError

        With a checkpoint and a write token (skipped here: it needs the network):

        >>> TransformerGMM(checkpoint="./my-model").push_to_hub("me/my-gmm")  # doctest: +SKIP
        """
        return storage.push_to_hub(
            self._checkpoint_to_publish(),
            repo_id,
            token=token,
            private=private,
            commit_message=commit_message,
            model_card=model_card,
        )

    def _checkpoint_to_publish(self) -> str | os.PathLike:
        if self.checkpoint is None or is_missing_default(self.checkpoint):
            why = "it uses no transformer" if self.checkpoint is None else "no default is bundled"
            raise storage.CheckpointError(
                f"This estimator has no transformer checkpoint to save (checkpoint="
                f"{self.checkpoint!r}: {why}). Set checkpoint= to a bundled name, a checkpoint "
                "folder or a Hub id first."
            )
        return self.checkpoint
