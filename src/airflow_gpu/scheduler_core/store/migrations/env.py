"""Alembic environment: the engine comes from `store.db` (no alembic.ini needed)."""

from alembic import context

from airflow_gpu.scheduler_core.store.models import Base

engine = context.config.attributes["engine"]
with engine.begin() as connection:
    context.configure(connection=connection, target_metadata=Base.metadata,
                      render_as_batch=engine.dialect.name == "sqlite")
    with context.begin_transaction():
        context.run_migrations()
