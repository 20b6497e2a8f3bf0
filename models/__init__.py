"""The shipped miniature checkpoints: data, nothing here runs at serve time.

In a checkout this folder is the `models` package only so that `python -m models.recipe.train` runs
from the repository's root, and finds this folder even where another project's `models` package is
installed (a regular package here wins over it; a namespace folder would not). `pip install .`
installs the data as runtime/shipped_models/ (setup.py), never a top-level `models`.
"""
