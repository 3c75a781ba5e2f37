"""Datasets: download (verified, content-addressed), safe archive handling, preprocessing.

``format`` defines the prepared-dataset file that every later step reads.
"""

# The official CIFAR-10 archive (python batches) and its published md5: the default dataset.
CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
CIFAR10_CHECKSUM = "md5:c58f30108f718f92721af3b95e74349a"
# At most this share of the train split becomes validation: one rule for the pipeline's
# val_fraction (params.py) and `cifar10-kfp data --val-fraction` (PrepareParams).
MAX_VAL_FRACTION = 0.5
