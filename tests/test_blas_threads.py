"""The fitted attributes' host products run numpy's BLAS on one thread (_blas.py): a
many-threaded call leaves its threads spinning against torch's."""

import threading

import numpy as np
from threadpoolctl import ThreadpoolController

from transformer_gmm import TransformerGMM
from transformer_gmm._blas import one_blas_thread


def _blas_threads() -> list[int]:
    libraries = ThreadpoolController().select(user_api="blas").lib_controllers
    return [library.num_threads for library in libraries]


def test_one_blas_thread_limits_while_it_runs_and_restores_after():
    before = _blas_threads()
    seen = one_blas_thread(_blas_threads)()
    assert seen and all(n == 1 for n in seen)
    assert _blas_threads() == before


def test_the_fitted_attributes_products_run_on_one_blas_thread(monkeypatch):
    """precisions_ (np.swapaxes, full covariances) and the identical-components check
    (np.tri) read the BLAS threads from inside their bodies, during a real fit."""
    seen = {}
    for name in ("swapaxes", "tri"):
        original = getattr(np, name)

        def spy(*args, name=name, original=original, **kwargs):
            seen.setdefault(name, []).append(_blas_threads())
            return original(*args, **kwargs)

        monkeypatch.setattr(np, name, spy)
    X = np.random.default_rng(0).normal(size=(120, 3))
    TransformerGMM(2, covariance_type="full", random_state=0).fit(X)
    assert set(seen) == {"swapaxes", "tri"}
    assert all(n == 1 for calls in seen.values() for threads in calls for n in threads)


def test_limited_calls_in_several_python_threads_leave_the_threads_as_they_were():
    """OpenBLAS's thread count is the process's: overlapping calls from two threads must
    not leave it at one."""
    before = _blas_threads()
    inside, leave = threading.Barrier(2), threading.Event()

    @one_blas_thread
    def hold():
        inside.wait(timeout=30)
        leave.wait(timeout=30)

    workers = [threading.Thread(target=hold) for _ in range(2)]
    for worker in workers:
        worker.start()
    leave.set()
    for worker in workers:
        worker.join(timeout=30)
    assert _blas_threads() == before
