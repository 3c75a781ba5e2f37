"""cifar10_kfp: the training library behind the cifar10-kfp pipelines.

Plain Python and PyTorch. It never imports kfp, so every step also runs from the
command line or a notebook without Kubeflow.
"""

__version__ = "0.1.0"
