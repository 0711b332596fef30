"""The versioned schema migrations (Alembic), run by :mod:`corr_pipeline.db.migrate`.

``env.py`` takes the connection :mod:`corr_pipeline.db.migrate` hands it (one transaction, under
an advisory lock); ``versions/`` holds one file per revision, each self-contained (it never imports
:mod:`corr_pipeline.db.schema`, which describes only the newest revision). A new revision:
copy ``script.py.mako``'s shape into ``versions/rNNNN_what.py`` with ``revision = "NNNN"`` and
``down_revision`` the previous one, then update ``schema.py`` so the two agree
(``corr_pipeline_tests/db/test_migrations.py`` compares them).
"""
