"""A stand-in for Pyodide's Python package, so that scripts written for Cloudflare's Python Workers
(which run on Pyodide) import here unmodified: `from pyodide.ffi import to_js, to_py, JsProxy,
create_proxy`. No JavaScript runs in the edge runtime: "JavaScript values" are Python objects
(a JsObject is a dict, a JsArray a list, a JsBuffer bytes) that the `workers` SDK accepts.
"""

__version__ = "0.0.0+edge.shim"  # not a Pyodide release: this package is the edge runtime's shim

__all__ = ["__version__"]
