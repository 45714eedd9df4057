"""`tuneline.data`: the demo data sets, the demo pipelines and the harness task files, shipped in the
package so that `tuneline demo` runs where tuneline is installed, not only in a checkout. Code finds
them through `importlib.resources.files("tuneline.data")`."""
