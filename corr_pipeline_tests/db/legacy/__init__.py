"""Verbatim copies of ``corr_pipeline/db/schema.py`` from releases before versioned migrations,
to create the databases those releases' ``init_schema`` created:

- ``schema_6a95e5e``: the first release (foreign keys from the snapshot tables to
  ``snapshots``; migration 0001 must reproduce it exactly);
- ``schema_40db00b``: the last release before migrations (reference triggers instead of the
  foreign keys, the later indexes; what migration 0002 reaches), whose ``init_schema`` also
  migrated older databases by hand.

Frozen: never edit them (``git show <commit>:corr_pipeline/db/schema.py``).
"""
