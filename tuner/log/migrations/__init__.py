"""Alembic migrations of the tuning log's schema, shipped inside the package.

Run them with ``tuner db upgrade`` (or :func:`tuner.log.migrate.upgrade`); no ``alembic.ini`` is
needed. Each file of ``versions/`` is one revision; the models in :mod:`tuner.log.schema` must
always equal the schema at head (``tests/test_migrations.py`` checks it on SQLite and PostgreSQL).

Writing a revision: copy the newest file of ``versions/``, set ``revision`` (the next number and a
few words) and ``down_revision``, write ``upgrade()`` with ``op.*`` calls spelled out (never
``metadata.create_all``: a revision is a frozen snapshot), and on SQLite alter tables through
``op.batch_alter_table``. Add a test in ``tests/test_migrations.py`` that data survives it.
"""
