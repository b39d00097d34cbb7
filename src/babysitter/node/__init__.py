"""The node agent: one process per host exporting GPU health, Xid errors, storage and checkpoint checks."""
