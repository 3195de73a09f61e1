"""token roles: team, admin or agent, and the hosts an agent token may register and report

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('tokens', schema=None) as batch_op:
        batch_op.add_column(sa.Column('role', sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column('hosts', sa.JSON(), nullable=True))
    op.execute("UPDATE tokens SET role = CASE WHEN admin THEN 'admin' ELSE 'team' END")


def downgrade() -> None:
    # agent tokens would become team tokens of their team: they go
    op.execute("DELETE FROM tokens WHERE role = 'agent'")
    with op.batch_alter_table('tokens', schema=None) as batch_op:
        batch_op.drop_column('hosts')
        batch_op.drop_column('role')
