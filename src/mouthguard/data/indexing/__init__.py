"""Indexing a user's dataset in place (:func:`~mouthguard.data.index_dataset`).

:mod:`.adopt` drives it, :mod:`.tarscan` indexes tars, :mod:`.pqindex` Parquet files.
"""
