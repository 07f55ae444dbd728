"""OTLP/HTTP export: encoding spans, sending requests, and the exporter built on both.

Nothing here knows RL-Insight; its direct transport uses these parts with an
endpoint it discovers. ``urllib3`` (the ``otlp`` extra) is imported only when a
sender is built, so importing this package needs no extra.
"""
