"""Relay's offline side on Spark: the ``relay-kafka`` data source (read and write topics), the
snapshot builder (a store's latest state per task as sorted SST files with a manifest) and the
helpers that start a session. Stores bootstrap from those snapshots (``statestore.snapshot``).
"""
