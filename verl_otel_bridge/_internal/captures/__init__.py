"""Captures: the ``jsonl`` exporter's files on disk, written and read in one place.

- :mod:`.lines`: complete lines of a file from any position, plain or gzip, in bounded memory.
"""
