"""Persistence for the service: SQLAlchemy 2 models and Alembic migrations.

SQLite (a file) by default, PostgreSQL by URL. Only the store's committed state counts.
"""
