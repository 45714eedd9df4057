"""`tuneline.deployments`: the deployment files (prefect.yaml), shipped in the package so that
`tuneline deploy` runs where tuneline is installed, not only in a checkout. Code finds them through
`importlib.resources.files("tuneline.deployments")`."""
