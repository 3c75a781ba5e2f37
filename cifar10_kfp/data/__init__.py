"""Datasets: download (verified, content-addressed), safe archive handling, preprocessing.

``format`` defines the prepared-dataset file that every later step reads.
"""
