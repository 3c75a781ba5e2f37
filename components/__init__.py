"""Kubeflow Pipelines components: thin ``@dsl.component`` adapters over ``cifar10_kfp``.

Each component imports ``cifar10_kfp`` inside its body and keeps only the stdlib and kfp at
module top level, so compiling a pipeline needs neither torch nor a GPU.
"""
