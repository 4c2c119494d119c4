"""Samples out of shards and rows out of row groups.

:mod:`.tarread` (tars), :mod:`.gztar` (gzip-compressed tars, read as one stream),
:mod:`.pqread` (Parquet).
"""
