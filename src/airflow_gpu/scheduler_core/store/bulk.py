"""One UPDATE for many rows, each with values of its own. SQLite runs it as executemany
(its driver loops in C). On PostgreSQL, psycopg's executemany sends, and Python-checks,
each row as a statement of its own: the rows go instead as one JSON document, which
`jsonb_to_recordset` turns back into typed rows, so one statement updates them all."""

from __future__ import annotations

import json
from datetime import datetime

from sqlalchemy import Table, Text, bindparam, cast, column, func, update
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Connection

_BUILT: dict[tuple, tuple] = {}     # statements by table, columns and dialect: built once


def update_rows(conn: Connection, table: Table, keys: tuple[str, ...],
                rows: list[dict], same: dict | None = None, where: tuple = ()) -> None:
    """UPDATE `table` SET each row's columns but `keys` WHERE its `keys` match (and the
    conditions `where`: constants, no values of their own); every row has the same
    columns. `same`: values every row takes alike."""
    same = same or {}
    cols = tuple(c for c in rows[0] if c not in keys)
    shape = (table.name, keys, cols, tuple(same), conn.dialect.name,
             tuple(map(str, where)))
    built = _BUILT.get(shape)
    if built is None:
        built = _BUILT[shape] = _build(table, keys, cols, tuple(same),
                                       conn.dialect.name == "postgresql", where)
    stmt, json_rows = built
    if json_rows:
        conn.execute(stmt, {"rows": json.dumps(rows, default=_iso), **same})
    else:
        conn.execute(stmt, [{**{f"b_{k}": r[k] for k in keys},
                             **{c: r[c] for c in cols}, **same} for r in rows])


def _build(table: Table, keys: tuple[str, ...], cols: tuple[str, ...],
           same: tuple[str, ...], json_rows: bool, where: tuple) -> tuple:
    if not json_rows:
        return update(table).where(*(table.c[k] == bindparam(f"b_{k}") for k in keys),
                                   *where), False
    v = (func.jsonb_to_recordset(cast(bindparam("rows", type_=Text), JSONB))
         .table_valued(*(column(c, table.c[c].type) for c in keys + cols))
         .render_derived("v", with_types=True))
    stmt = (update(table).where(*(table.c[k] == v.c[k] for k in keys), *where)
            .values({**{c: v.c[c] for c in cols},
                     **{c: bindparam(c, type_=table.c[c].type) for c in same}}))
    return stmt, True


def _iso(value):
    """Times as PostgreSQL reads them back exactly (the rows' only values JSON lacks)."""
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not a column value")
