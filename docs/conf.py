"""Sphinx configuration: Markdown pages (MyST), the API reference from the numpydoc
docstrings, the examples gallery (sphinx-gallery runs every example, at full size) and the
front page's figure (matplotlib's plot directive runs docs/when_to_use.py), in the
PyData theme."""

import os
import sys
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
    "matplotlib.sphinxext.plot_directive",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build", "auto_examples/*.ipynb", "auto_examples/*.py"]
html_theme = "pydata_sphinx_theme"
html_title = f"transformer-gmm {release}"
html_theme_options = {
    # The header on one row at 1280 px: the name without the version (the page title keeps
    # it), five short entries before "More" (index.md's toctree gives the short titles), and
    # the search as an icon (on phones too), not a wide field.
    "logo": {"text": project},
    "navbar_align": "left",
    "header_links_before_dropdown": 5,
    "navbar_persistent": ["search-button"],
    "show_toc_level": 2,
    # The left sidebar only where a page lists pages below it (the API reference): the
    # other pages, and their wide tables, get its width.
    "sidebar_includehidden": False,
    "secondary_sidebar_items": ["page-toc", "sg_download_links"],  # the latter on examples
}
html_context = {"default_mode": "auto"}  # light or dark, as the reader's system is
html_static_path = ["_static"]
html_css_files = ["custom.css"]
# The API pages are titled by the short name (TransformerGMM, TransformerGMM.fit); the
# signature below the title gives the module.
templates_path = ["_templates"]

autosummary_generate = True
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False

# Links to the projects we stand beside; no network at build time, so no inventories.
intersphinx_mapping = {}
nitpicky = False

sphinx_gallery_conf = {
    "examples_dirs": "../examples",
    "gallery_dirs": "auto_examples",
    # Execute every example, not only plot_*.py, so that each gallery entry shows its
    # figure and output. The build leaves TRANSFORMER_GMM_EXAMPLES_QUICK unset: the examples
    # run at full size (the test suite runs them in their quick mode).
    "filename_pattern": r"\.py$",
    "download_all_examples": False,
    "remove_config_comments": True,
    # The order a newcomer needs them in (docs/gallery.py), not the file names'.
    "within_subsection_order": "gallery.order",
}
sys.path.insert(0, os.path.dirname(__file__))  # for gallery.order
os.environ.pop("TRANSFORMER_GMM_EXAMPLES_QUICK", None)

# The front page's figure: PNG only, no links to the script or other formats.
plot_formats = [("png", 110)]
plot_html_show_source_link = False
plot_html_show_formats = False

# Where the checkpoint has no head for a K, a fit falls back to k-means++ with this
# warning; the user guide documents it, and the gallery does not repeat it on every page.
warnings.filterwarnings("ignore", category=transformer_gmm.FallbackWarning)
