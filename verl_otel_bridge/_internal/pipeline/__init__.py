"""From ended spans to exporters: the processors, the export queue and the exporter chain (:mod:`.chain`)."""
