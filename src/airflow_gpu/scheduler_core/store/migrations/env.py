"""Alembic environment: the engine comes from `store.db` (no alembic.ini needed), or the
connection to migrate on (store.db.upgrade holds the migration lock on it)."""

from alembic import context

from airflow_gpu.scheduler_core.store.models import Base


def _run(connection, dialect: str) -> None:
    context.configure(connection=connection, target_metadata=Base.metadata,
                      render_as_batch=dialect == "sqlite")
    with context.begin_transaction():
        context.run_migrations()


given = context.config.attributes.get("connection")
if given is not None:
    _run(given, given.dialect.name)
else:
    engine = context.config.attributes["engine"]
    with engine.begin() as connection:
        _run(connection, engine.dialect.name)
