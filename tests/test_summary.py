"""Reading a weighted summary: Lloyd's cells with counts, read by the backbone as copies."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import TINY_CHECKPOINT, make_blobs, make_tiny_checkpoint
from sklearn.metrics import adjusted_rand_score

from transformer_gmm import TransformerClusterer, TransformerGMM, fit_many
from transformer_gmm.engine import readout
from transformer_gmm.engine.fit import SELECTION_ROWS
from transformer_gmm.engine.summary import SUMMARY_ROWS, summarize, summarize_views
from transformer_gmm.nn import ReadingConfig
from transformer_gmm.storage import load_checkpoint, load_model


@pytest.fixture(scope="module")
def cells_checkpoint(tmp_path_factory) -> str:
    """The tiny checkpoint's weights, reading datasets of more than 16 rows as 16 cells."""
    return str(make_tiny_checkpoint(tmp_path_factory.mktemp("cells") / "c", summary_cells=16))


def test_cells_tile_every_real_row():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(3, 200, 4, generator=g)
    mask = torch.ones(3, 200, dtype=torch.bool)
    mask[1, 50:] = False  # 50 real rows
    mask[2, 10:] = False  # fewer real rows than cells
    cells = summarize(z, mask, 16, g)
    assert cells.centres.shape == (3, 16, 4) and cells.cell_of_row.shape == (3, 200)
    assert cells.counts.sum(1).tolist() == [200.0, 50.0, 10.0]
    for b in range(3):
        real = mask[b]
        counted = torch.bincount(cells.cell_of_row[b, real], minlength=16).float()
        torch.testing.assert_close(counted, cells.counts[b])
        # A cell's centre is where its rows are: the mean of its rows, to Lloyd's last move.
        for c in torch.nonzero(cells.counts[b] > 0).flatten().tolist():
            rows = z[b, real][cells.cell_of_row[b, real] == c]
            assert torch.linalg.vector_norm(rows.mean(0) - cells.centres[b, c]) < 1.0
    # Ten rows, sixteen cells: each row is a cell of its own, read once.
    ten = cells.counts[2][cells.counts[2] > 0]
    assert ten.tolist() == [1.0] * 10


@pytest.mark.parametrize("n_datasets", [1, 3])
def test_the_views_summaries_are_each_views_own(n_datasets):
    # One batched Lloyd for every view gives each view the cells its own call would give,
    # from the same draws in the same order.
    g = torch.Generator().manual_seed(0)
    z = torch.randn(n_datasets, 150, 4, generator=g)
    mask = None
    if n_datasets > 1:
        mask = torch.ones(n_datasets, 150, dtype=torch.bool)
        mask[1, 60:] = False
        z = z * mask[..., None]
    alone, together = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    expected = [summarize(z, mask, 16, alone) for _ in range(4)]
    views = summarize_views(z, mask, 16, together, 4)
    assert len(views) == 4
    for view, own in zip(views, expected, strict=True):
        for got, want in zip(view, own, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    assert torch.equal(alone.get_state(), together.get_state())


def test_no_summary_of_no_more_rows_than_cells_nor_of_large_data(cells_checkpoint):
    g = torch.Generator().manual_seed(0)
    assert summarize(torch.randn(1, 16, 3), None, 16, g) is None
    assert summarize(torch.randn(1, 17, 3), None, 16, g) is not None
    # Fits read cells of datasets up to SUMMARY_ROWS rows, and rows beyond: so the
    # subsample a large fit builds its starts on is read as rows too.
    assert SUMMARY_ROWS < SELECTION_ROWS
    model = load_model(cells_checkpoint)
    context = model.reading_config.context_size
    for n_rows, read_as in [(SUMMARY_ROWS, 16), (SUMMARY_ROWS + 1, context)]:
        x = torch.randn(1, n_rows, 3, generator=g, dtype=torch.float64)
        read = readout.read_views(model, x, None, 2, g, n_views=1)
        assert read.views.shape[1] == read_as
        assert (read.views_weights is None) == (read_as == context)


def test_the_start_reads_the_cells_as_their_copies(cells_checkpoint):
    # The mixture start is what the model reads off the cells' multiset: the same output
    # as reading the centres repeated by their counts, row for row.
    model = load_model(cells_checkpoint)
    x = torch.from_numpy(make_blobs(40, [[-5, 0, 0], [5, 0, 0]]))[None]  # (1, 80, 3)
    read = readout.read_views(model, x, None, 2, torch.Generator().manual_seed(1), n_views=1)
    assert read.views.shape[1] == 16 and read.views_weights.sum() == 80
    repeated = read.views[0].repeat_interleave(read.views_weights[0].long(), dim=0)[None]
    with torch.no_grad():
        weighted = model(read.views, 2, weights=read.views_weights)
        copies = model(repeated, 2)
    torch.testing.assert_close(weighted.means, copies.means, atol=1e-5, rtol=0)


@pytest.mark.parametrize("covariance_type", ["full", "tied", "diag", "spherical"])
def test_fits_reading_cells_are_deterministic_and_ignore_row_order(
    cells_checkpoint, covariance_type
):
    X = make_blobs(40, [[-6, 0], [0, 6], [6, 0]], seed=2)
    order = np.random.default_rng(3).permutation(len(X))
    fits = [
        TransformerGMM(3, covariance_type=covariance_type, checkpoint=cells_checkpoint,
                       random_state=0).fit(data)
        for data in (X, X, X[order])
    ]
    np.testing.assert_array_equal(fits[0].means_, fits[1].means_)
    np.testing.assert_allclose(fits[0].means_, fits[2].means_, atol=1e-10)
    assert fits[0].score(X) > -5.0  # three clear blobs of unit spread in the plane


def test_reading_cells_finds_the_blobs_as_reading_rows_does(cells_checkpoint):
    X = make_blobs(60, [[-8, 0], [0, 8], [8, 0]], seed=4)
    for n_init in (1, 2):  # the mixture start, then the per-point start beside it
        cells = TransformerGMM(3, checkpoint=cells_checkpoint, n_init=n_init,
                               random_state=0).fit(X)
        rows = TransformerGMM(3, checkpoint=TINY_CHECKPOINT, n_init=n_init,
                              random_state=0).fit(X)
        assert cells.score(X) == pytest.approx(rows.score(X), abs=1e-6)
    labels = TransformerClusterer(3, checkpoint=cells_checkpoint, random_state=0).fit_predict(X)
    blob = np.round(X[:, 0] / 8) + 2 * np.round(X[:, 1] / 8)  # -1, 2 or 1: each row's blob
    assert adjusted_rand_score(blob, labels) == 1.0


def test_fit_many_reads_datasets_of_other_sizes_as_fit_does(cells_checkpoint):
    # Padded into one batch, a dataset of fewer rows than cells and a larger one: the
    # small one is read as its rows (each its own cell), the large one as its cells.
    small = make_blobs(6, [[-5, 0], [5, 0]], seed=5)  # 12 rows, under 16 cells
    large = make_blobs(50, [[-5, 0], [5, 0]], seed=6)
    many = fit_many([small, large], 2, checkpoint=cells_checkpoint, n_init=1, random_state=0)
    for X, fitted in zip((small, large), many, strict=True):
        alone = TransformerGMM(2, checkpoint=cells_checkpoint, n_init=1, random_state=0).fit(X)
        assert sorted(np.round(fitted.means_[:, 0] / 5).tolist()) == [-1.0, 1.0]
        assert fitted.score(X) == pytest.approx(alone.score(X), abs=1e-6)


def test_the_checkpoint_says_how_many_lloyd_iterations_make_the_cells(tmp_path):
    # summary_iterations (ReadingConfig) bounds Lloyd's iterations; a config.json written
    # before the field existed reads the 8 its checkpoints were measured with.
    folder = make_tiny_checkpoint(tmp_path / "c", summary_cells=16, summary_iterations=0)
    model = load_model(folder)
    assert model.reading_config.summary_iterations == 0
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 200, 3, generator=g, dtype=torch.float64)
    draws, lloyd = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    read = readout.read_views(model, x, None, 2, draws, n_views=1)
    z = read.z
    # No iteration: the cells are those of the drawn rows, each read at its drawn row.
    none = summarize(z, None, 16, lloyd, n_iterations=0)
    torch.testing.assert_close(read.views, none.centres * read.signs[0])
    eight = summarize(z, None, 16, torch.Generator().manual_seed(1))
    assert not torch.equal(none.centres, eight.centres)  # the default moves them

    config = json.loads((folder / "config.json").read_text())
    del config["summary_iterations"]
    (folder / "config.json").write_text(json.dumps(config))
    assert load_checkpoint(folder).reading_config.summary_iterations == 8
    assert ReadingConfig().summary_iterations == 8
    with pytest.raises(ValueError, match="summary_iterations"):
        ReadingConfig(summary_iterations=-1)
