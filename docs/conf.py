"""Sphinx configuration for the pysparse_hpc documentation.

Build the HTML pages with ``python -m sphinx -W --keep-going -b html docs docs/_build/html`` and
run the examples in the pages with ``python -m sphinx -b doctest docs docs/_build/doctest``.
"""
import os
import sys

# Prefer the checkout the docs sit in over another installed copy, so the pages describe this
# source tree (the compiled extensions must already be built in place or installed editable).
sys.path.insert(0, os.path.abspath(".."))

import pysparse_hpc  # noqa: E402

# -- Project ----------------------------------------------------------------------------------
project = "pysparse_hpc"
author = "The pysparse_hpc developers"
copyright = "The pysparse_hpc developers"
release = pysparse_hpc.__version__
version = ".".join(release.split(".")[:2])

# -- General ----------------------------------------------------------------------------------
# No intersphinx: the docs must build without network access.
extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.doctest",
    "numpydoc",
]

templates_path = ["_templates"]
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]
# Single backticks in the docstrings name other objects of the package (`csr_array`), so the
# default role resolves them as cross-references instead of rendering them as italics.
default_role = "py:obj"
nitpicky = False

# -- autodoc / autosummary --------------------------------------------------------------------
autosummary_generate = True
autosummary_imported_members = False
autodoc_default_options = {
    "member-order": "groupwise",
}
# The signatures already show the parameters; the numpydoc sections describe them.
autodoc_typehints = "none"

# -- numpydoc ---------------------------------------------------------------------------------
# The class pages list their members through the autosummary templates in _templates, so
# numpydoc's own member tables would duplicate them (and point at pages that are not generated).
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False

# -- doctest ----------------------------------------------------------------------------------
doctest_global_setup = """
import numpy as np
import pysparse_hpc as sph
"""

# -- HTML -------------------------------------------------------------------------------------
html_theme = "alabaster"
html_theme_options = {
    "description": "Sparse matrix formats and kernels for deep learning and HPC",
    "fixed_sidebar": True,
}
html_static_path = []
