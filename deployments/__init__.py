"""`tuneline.deployments`: the deployment files, shipped in the package so that `tuneline deploy` runs
where tuneline is installed, not only in a checkout: prefect.yaml (the flows' deployments), and the
production files of a cluster (docs/deployments.md, "Run on a cluster"): compose.yaml (the servers, the object
store and the workers), Dockerfile (the tuneline image) and kubernetes-gpu-pool.json (a Kubernetes
work pool's base job template that requests each stage's GPUs). Code finds them through
`importlib.resources.files("tuneline.deployments")`."""
