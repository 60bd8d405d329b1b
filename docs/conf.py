"""Sphinx configuration: Markdown pages (MyST), the API reference from the numpydoc
docstrings, and the examples gallery (sphinx-gallery runs every example)."""

import warnings

import transformer_gmm

project = "transformer-gmm"
release = version = transformer_gmm.__version__
copyright = "the transformer-gmm authors"

extensions = [
    "myst_parser",
    "numpydoc",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.intersphinx",
    "sphinx_gallery.gen_gallery",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build", "auto_examples/*.ipynb", "auto_examples/*.py"]
html_theme = "alabaster"

autosummary_generate = True
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False

# Links to the projects we stand beside; no network at build time, so no inventories.
intersphinx_mapping = {}
nitpicky = False

sphinx_gallery_conf = {
    "examples_dirs": "../examples",
    "gallery_dirs": "auto_examples",
    "filename_pattern": r"\.py$",  # run every example, not only plot_*.py
    "download_all_examples": False,
    "remove_config_comments": True,
}

# The examples fall back to EM while no default checkpoint is bundled; the warning is
# documented in the user guide, not repeated on every page.
warnings.filterwarnings("ignore", category=transformer_gmm.FallbackWarning)
