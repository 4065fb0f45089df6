"""Alembic environment, driven from code (`mainspring.store.db.init_db`): no alembic.ini.

`init_db` hands over an open connection in `config.attributes["connection"]`, so the migration runs
inside the caller's engine setup (SQLite pragmas, BEGIN handling). Without one (the `alembic`
command pointed at this folder) a connection is made from `sqlalchemy.url`.
"""

from alembic import context
from sqlalchemy import Connection, create_engine

from mainspring.schema import metadata  # every layer's tables: the one upward import store/ makes

config = context.config
target_metadata = metadata


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",  # SQLite ALTER needs table copies
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    context.configure(url=config.get_main_option("sqlalchemy.url"), target_metadata=target_metadata,
                      literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
elif (conn := config.attributes.get("connection")) is not None:
    _run(conn)
else:
    url = config.get_main_option("sqlalchemy.url")
    if not url:  # the `alembic` command run bare: name what is missing rather than fail inside SQLAlchemy
        raise RuntimeError("no sqlalchemy.url: give alembic one, or migrate through mainspring.store.db.init_db")
    with create_engine(url).connect() as conn:
        _run(conn)
