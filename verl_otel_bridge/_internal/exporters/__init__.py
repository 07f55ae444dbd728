"""Destinations, each one class with one job: take a batch, return one outcome (:mod:`.destination`)."""
