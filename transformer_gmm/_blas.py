"""numpy's BLAS on one thread, for the package's own products on the host.

The fitted attributes' products (``precisions_`` from their factors, the check for
identical components) are small: K products of d x d. A multi-threaded BLAS call leaves
its threads spinning for milliseconds after it returns, and there they compete for the
cores with torch's threads, which run the next fit, step or prediction: on two cores, a
fit of 200 rows of 100 features with full covariances took over 3 times as long after the
previous fit's products (docs/performance.md, "Threads"). One thread is as fast for
products this small, and leaves nothing spinning. scikit-learn's ``KMeans`` limits its
BLAS the same way, for its own OpenMP threads.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

from threadpoolctl import ThreadpoolController

F = TypeVar("F", bound=Callable)

_controller: ThreadpoolController | None = None


def _threadpools() -> ThreadpoolController:
    """The BLAS and OpenMP libraries loaded, found once (finding them takes milliseconds)."""
    global _controller
    if _controller is None:
        _controller = ThreadpoolController()
    return _controller


def one_blas_thread(function: F) -> F:
    """``function`` with numpy's and scipy's BLAS limited to one thread while it runs (the
    limit before it is restored after; torch's own BLAS is not affected). An OpenBLAS
    thread pool is the process's: threadpoolctl lets one Python thread at a time set it,
    so calls from several threads cannot leave each other's limit in place."""

    @functools.wraps(function)
    def limited(*args, **kwargs):
        with _threadpools().limit(limits=1, user_api="blas"):
            return function(*args, **kwargs)

    return limited  # type: ignore[return-value]
