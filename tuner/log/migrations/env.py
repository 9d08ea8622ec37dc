"""Alembic environment of the tuning log, run by :mod:`tuner.log.migrate`.

The caller passes an open connection in ``config.attributes["connection"]``, inside a transaction
it controls (and a lock it holds), so a migration is applied entirely or not at all. Without one
(``alembic`` run by hand with ``-x url=...`` or ``sqlalchemy.url``), an engine is made here.
"""

from alembic import context

from tuner.log import schema
from tuner.log.database import create_log_engine
from tuner.log.migrate import VERSION_TABLE

config = context.config


def _configure(**kwargs) -> None:
    context.configure(
        target_metadata=schema.metadata,
        version_table=VERSION_TABLE,
        compare_type=True,
        **kwargs,
    )


def _url() -> str:
    return context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option("sqlalchemy.url")


if context.is_offline_mode():
    _configure(url=_url(), literal_binds=True, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    connection = config.attributes.get("connection")
    engine = None
    if connection is None:
        engine = create_log_engine(_url())
        connection = engine.connect()
    try:
        _configure(connection=connection, render_as_batch=connection.dialect.name == "sqlite")
        with context.begin_transaction():
            context.run_migrations()
    finally:
        if engine is not None:
            connection.close()
            engine.dispose()
