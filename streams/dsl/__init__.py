"""Internal: the DSL that builds a topology (streams, tables, windows) and the processors
it compiles to. The public names are re-exported by :mod:`streams`."""
