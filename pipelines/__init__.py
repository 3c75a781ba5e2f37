"""Kubeflow Pipelines DAGs, cluster policy and the ``cifar10-kfp`` command line."""
