"""Captures: the ``jsonl`` exporter's files on disk, written and read in one place.

- :mod:`.layout`: the names (run folder, ``global_steps=<n>`` step folders, ``<host>-<pid>-<k>.jsonl.gz``);
- :mod:`.run`: the run folder's name every process of a run agrees on;
- :mod:`.files`: one private file appended a batch at a time (a gzip member per batch);
- the destination that writes a run folder is :class:`verl_otel_bridge._internal.exporters.capture_dir.CaptureDir`;
- :mod:`.budget`: the run folder's disk budget, shared by every process writing into it;
- :mod:`.lines`: complete lines of a file from any position, plain or gzip, in bounded memory;
- :mod:`.read`: which files a path names, and their records (every reader's way in).
"""
